//! Virtual memory management: physical handles, reservations, mappings.
use super::*;

impl Driver {
    // ---- VMM ----

    pub fn vmm_create(&self, size: u64, loc_type: u32, loc_id: i32, alloc_type: u32) -> R<u64> {
        if alloc_type != 1 || loc_type != 1 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let dev = self
            .device(loc_id)
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        self.m.reserve(dev, size).map_err(machine_err)?;
        let mut g = self.lock();
        let id = g.id(T_VMM);
        g.vmm.insert(
            id,
            Vmm {
                dev,
                size,
                maps: 0,
                released: false,
                backing: None,
            },
        );
        Ok(id)
    }

    pub fn vmm_release(&self, h: u64) -> R {
        let mut g = self.lock();
        let v = g
            .vmm
            .get_mut(&h)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if v.released {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        v.released = true;
        if v.maps == 0 {
            let v = g.vmm.remove(&h).expect("present");
            self.m.unreserve(v.dev, v.size);
        }
        Ok(())
    }

    pub fn va_reserve(&self, size: u64, align: u64) -> R<u64> {
        if size == 0
            || !size.is_multiple_of(GRANULARITY)
            || (align != 0 && !align.is_power_of_two())
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut g = self.lock();
        let p = g.va(size, align.max(GRANULARITY), false)?;
        g.reservations.insert(p, size);
        Ok(p)
    }

    pub fn va_free(&self, p: u64, size: u64) -> R {
        let mut g = self.lock();
        match g.reservations.get(&p) {
            Some(s) if *s == size => {}
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        if g.mappings.range(p..p + size).next().is_some() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        g.reservations.remove(&p);
        Ok(())
    }

    pub(super) fn in_reservation(g: &Inner, p: u64, size: u64) -> bool {
        g.reservations
            .range(..=p)
            .next_back()
            .is_some_and(|(s, l)| p + size <= s + l)
    }

    pub fn vmm_map(&self, p: u64, size: u64, offset: u64, h: u64) -> R {
        let mut g = self.lock();
        let v = g.vmm.get(&h).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if v.released || size == 0 || offset.checked_add(size).is_none_or(|e| e > v.size) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !Self::in_reservation(&g, p, size) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let clash = g
            .mappings
            .range(..p + size)
            .next_back()
            .is_some_and(|(s, (l, _, _))| s + l > p);
        if clash {
            return Err(CUresult::CUDA_ERROR_ALREADY_MAPPED);
        }
        g.mappings.insert(p, (size, h, offset));
        if let Some(v) = g.vmm.get_mut(&h) {
            v.maps += 1;
        }
        Ok(())
    }

    pub fn vmm_unmap(&self, p: u64, size: u64) -> R {
        let mut g = self.lock();
        let hit: Vec<u64> = g
            .mappings
            .range(p..p.saturating_add(size))
            .map(|(k, _)| *k)
            .collect();
        if hit.is_empty() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for k in hit {
            if let Some((_, h, _)) = g.mappings.remove(&k) {
                if let Some(v) = g.vmm.get_mut(&h) {
                    v.maps = v.maps.saturating_sub(1);
                    if v.released && v.maps == 0 {
                        let v = g.vmm.remove(&h).expect("present");
                        self.m.unreserve(v.dev, v.size);
                    }
                }
            }
        }
        Ok(())
    }

    pub fn vmm_set_access(&self, p: u64, size: u64, locs: &[(u32, i32, u32)]) -> R {
        if locs.is_empty() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for (ty, id, flags) in locs {
            if *ty != 1 || *flags > 3 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            self.device(*id)?;
        }
        let g = self.lock();
        let mapped: u64 = g
            .mappings
            .range(p..p.saturating_add(size))
            .map(|(_, (l, _, _))| *l)
            .sum();
        if mapped < size {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
}
