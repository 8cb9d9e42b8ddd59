//! What NVML's monitoring queries report for a simulated device: clocks,
//! power, temperature, BAR1, serial. Values are those of the data-centre
//! part the device's compute capability names (8.x: A100-SXM4, 9.x:
//! H100-SXM5; anything else reads as an A100), and clocks, power and
//! temperature follow the device's utilization linearly from idle to full
//! load. Pure functions: no state, no I/O. Documented in docs/sim.md.

/// Fixed figures of one GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// Graphics/SM clock at idle and at full load, MHz (max = busy).
    pub sm_idle_mhz: u32,
    pub sm_max_mhz: u32,
    /// HBM clock, MHz (constant).
    pub mem_mhz: u32,
    /// Video clock at idle and max, MHz.
    pub video_idle_mhz: u32,
    pub video_max_mhz: u32,
    /// Board power at idle and at full load, and the enforced limit, mW.
    pub power_idle_mw: u32,
    pub power_busy_mw: u32,
    pub power_limit_mw: u32,
    /// The smallest limit `nvidia-smi -pl` accepts, mW.
    pub power_min_limit_mw: u32,
    /// GPU temperature at idle and at full load, degrees C.
    pub temp_idle_c: u32,
    pub temp_busy_c: u32,
    /// BAR1 aperture, bytes.
    pub bar1_bytes: u64,
    /// NVLinks (SXM boards).
    pub nvlinks: u32,
    /// Most MIG devices (instances) the part supports.
    pub max_mig_devices: u32,
    /// Confidential computing is available (Hopper on).
    pub conf_compute: bool,
}

pub const A100_SXM4: Part = Part {
    sm_idle_mhz: 210,
    sm_max_mhz: 1410,
    mem_mhz: 1593,
    video_idle_mhz: 795,
    video_max_mhz: 1290,
    power_idle_mw: 60_000,
    power_busy_mw: 350_000,
    power_limit_mw: 400_000,
    power_min_limit_mw: 100_000,
    temp_idle_c: 32,
    temp_busy_c: 64,
    bar1_bytes: 128 << 30,
    nvlinks: 12,
    max_mig_devices: 7,
    conf_compute: false,
};

pub const H100_SXM5: Part = Part {
    sm_idle_mhz: 345,
    sm_max_mhz: 1980,
    mem_mhz: 2619,
    video_idle_mhz: 765,
    video_max_mhz: 1755,
    power_idle_mw: 70_000,
    power_busy_mw: 620_000,
    power_limit_mw: 700_000,
    power_min_limit_mw: 200_000,
    temp_idle_c: 30,
    temp_busy_c: 66,
    bar1_bytes: 128 << 30,
    nvlinks: 18,
    max_mig_devices: 7,
    conf_compute: true,
};

/// The part a device of compute capability `major.x` stands for.
pub fn part(cc_major: u32) -> Part {
    match cc_major {
        9 => H100_SXM5,
        _ => A100_SXM4,
    }
}

/// `idle + (busy - idle) * util / 100`, rounded down; `util` clamped to 100.
fn follow(idle: u32, busy: u32, util: u32) -> u32 {
    let u = u64::from(util.min(100));
    let (i, b) = (u64::from(idle), u64::from(busy));
    if b >= i {
        (i + (b - i) * u / 100) as u32
    } else {
        (i - (i - b) * u / 100) as u32
    }
}

impl Part {
    /// Current graphics/SM clock at `util` percent.
    pub fn sm_clock(&self, util: u32) -> u32 {
        follow(self.sm_idle_mhz, self.sm_max_mhz, util)
    }

    pub fn video_clock(&self, util: u32) -> u32 {
        follow(self.video_idle_mhz, self.video_max_mhz, util)
    }

    pub fn power_mw(&self, util: u32) -> u32 {
        follow(self.power_idle_mw, self.power_busy_mw, util)
    }

    pub fn temperature_c(&self, util: u32) -> u32 {
        follow(self.temp_idle_c, self.temp_busy_c, util)
    }

    /// BAR1 in use: 2 MiB per process holding a context, plus 1 MiB the
    /// driver keeps.
    pub fn bar1_used(&self, processes: usize) -> u64 {
        ((1 + 2 * processes as u64) << 20).min(self.bar1_bytes)
    }
}

/// A 13-digit board serial, stable per device index.
pub fn serial(dev: usize) -> String {
    format!("{}", 1_322_721_000_000u64 + dev as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_follows_utilization_within_the_parts_range() {
        let a = part(8);
        assert_eq!(a, A100_SXM4);
        assert_eq!(part(9), H100_SXM5);
        assert_eq!(a.sm_clock(0), 210);
        assert_eq!(a.sm_clock(100), 1410);
        assert_eq!(a.sm_clock(250), 1410, "clamped");
        assert_eq!(a.sm_clock(50), 810);
        assert!(a.power_mw(100) < a.power_limit_mw);
        assert!(a.power_mw(0) < a.power_mw(1) || a.power_mw(0) == a.power_mw(1));
        assert_eq!(a.temperature_c(100), 64);
        assert_eq!(a.bar1_used(2), 5 << 20);
        assert_eq!(serial(1).len(), 13);
        assert_ne!(serial(0), serial(1));
    }
}
