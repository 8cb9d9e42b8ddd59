//! A process whose liveness cannot be proved is alive: a non-root tenant
//! under `hidepid=2` (it cannot see root's /proc entries) must not judge a
//! live root process dead and reclaim its slot (the device then held more
//! than the budget).
use crate::common;

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use vgpu_region::Region;

#[test]
fn a_hidden_live_process_is_not_reclaimed() {
    if !common::is_root() {
        common::skip("needs root (a user, a private mount namespace)");
        return;
    }
    common::tenant_user();
    let dir = common::shared_tempdir();
    let path = dir.path().join("region.cache");
    // A root process holds 1000 bytes of a 1500-byte budget and stays.
    let mut gate = common::Gate::closed(&dir.path().join("gate"));
    let mut c = common::worker();
    c.arg("script").arg(&path).arg(format!(
        "create:8:1500,register,reserve:1000,gate:{}",
        gate.path.display()
    ));
    let mut holder = common::spawn(c);
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let line = common::read_line(&mut out);
    assert!(line.starts_with("slot="), "{line}");
    // The region's mode is not what this test is about.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let pid = holder.id();
    // The tenant, in a mount namespace whose /proc is a new instance with
    // hidepid=2 (a new mount, not a remount: a remount would change the
    // one procfs every other process on the machine shares).
    let script = format!(
        "mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid={u} --regid={g} \
         --clear-groups -- sh -c 'if [ -e /proc/{pid}/stat ]; then echo VISIBLE; exit 3; fi; \
         exec \"$0\" script \"$1\" open,register,reclaim,reserve:1000' \"$0\" \"$1\"",
        u = common::tenant_user().0,
        g = common::tenant_user().1,
    );
    let t = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .arg(common::WORKER)
        .arg(&path)
        .env_remove(vgpu_region::failpoint::ENV)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&t.stdout);
    assert!(
        t.status.success(),
        "tenant: {text} {}",
        String::from_utf8_lossy(&t.stderr)
    );
    assert!(!text.contains("VISIBLE"), "hidepid=2 not in effect: {text}");
    assert!(
        text.contains("reclaimed=0"),
        "a live root process was reclaimed: {text}"
    );
    assert!(
        text.contains("refused"),
        "the tenant got past the budget: {text}"
    );
    let r = Region::open(&path).unwrap();
    let snap = r.snapshot();
    assert!(
        snap.slots.iter().any(|s| s.pid == pid && s.state == "live"),
        "holder's slot gone: {snap:?}"
    );
    assert_eq!(r.device_used(0), 1000);
    gate.open();
    assert!(holder.wait().unwrap().success());
    // Once they have exited, death is provable (to root, who sees every
    // entry): the holder's and the tenant's slots are reclaimed.
    assert_eq!(r.reclaim_dead(), 2);
    assert_eq!(r.device_used(0), 0);
}
