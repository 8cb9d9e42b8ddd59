//! `vgpu demo`: two tenants on one simulated GPU, each container with a
//! 2 GiB budget; one stays under, one is refused at its limit; each sees its
//! own `cuMemGetInfo` and NVML view; the ledger shows who holds what.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};

use anyhow::{bail, Context};

use crate::cmd_run::{locate_lib, preload_env, private_dir};

#[derive(clap::Args)]
pub struct Args {
    /// Budget of each tenant's container.
    #[arg(long, default_value = "2GiB")]
    budget: String,
    /// Keep the temporary regions (their paths are printed).
    #[arg(long)]
    keep: bool,
}

struct Tenant {
    name: &'static str,
    target: u64,
    region: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    facts: BTreeMap<String, String>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

fn gib(b: u64) -> String {
    const G: f64 = (1u64 << 30) as f64;
    const M: f64 = (1u64 << 20) as f64;
    let f = b as f64;
    if b >= 1 << 30 {
        format!("{:.2} GiB", f / G)
    } else if b >= 1 << 20 {
        format!("{:.0} MiB", f / M)
    } else {
        format!("{b} B")
    }
}

impl Tenant {
    fn spawn(
        name: &'static str,
        target: u64,
        exe: &Path,
        env: Vec<(String, String)>,
        region: PathBuf,
    ) -> anyhow::Result<Tenant> {
        let mut child = Command::new(exe)
            .args([
                "run", "--name", name, "--chunk", "256m", "--hold", "--target",
            ])
            .arg(target.to_string())
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting tenant {name} ({})", exe.display()))?;
        let stdin = child.stdin.take();
        let out = child.stdout.take().context("tenant stdout")?;
        Ok(Tenant {
            name,
            target,
            region,
            child,
            stdin,
            facts: BTreeMap::new(),
            lines: BufReader::new(out).lines(),
        })
    }

    /// Reads `name.key=value` lines until `until` (or EOF).
    fn read_until(&mut self, until: &str) -> anyhow::Result<()> {
        for l in self.lines.by_ref() {
            let l = l?;
            if let Some((k, v)) = l.split_once('=') {
                let k = k
                    .strip_prefix(self.name)
                    .and_then(|k| k.strip_prefix('.'))
                    .unwrap_or(k);
                self.facts.insert(k.to_string(), v.to_string());
                if k == until {
                    return Ok(());
                }
            }
        }
        bail!("tenant {} ended early: {:?}", self.name, self.facts)
    }

    fn num(&self, k: &str) -> u64 {
        self.facts.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

fn ledger_line(name: &str, region: &Path) -> String {
    match vgpu_region::Region::open(region) {
        Err(e) => format!("  {name:<6} {}: cannot open ({e})", region.display()),
        Ok(r) => {
            let s = r.snapshot();
            let live: Vec<String> = s
                .slots
                .iter()
                .filter(|sl| sl.state == "live")
                .map(|sl| sl.pid.to_string())
                .collect();
            let mut out = String::new();
            for d in &s.devices {
                out.push_str(&format!(
                    "  {name:<6} device {} {}: limit {}, in use {} (context {}, data {}); live processes: {}\n",
                    d.index,
                    d.uuid,
                    gib(d.limits.mem),
                    gib(d.used),
                    gib(d.context),
                    gib(d.data),
                    if live.is_empty() { "none".to_string() } else { live.join(", ") }
                ));
            }
            out.push_str(&format!("         region {}", region.display()));
            out
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let budget = vgpu_region::units::parse_mem_size(&args.budget)
        .with_context(|| format!("--budget {:?}", args.budget))?;
    if budget < (512 << 20) {
        bail!("--budget {} is below the 512 MiB this demo needs (a 256 MiB context estimate plus allocations)", args.budget);
    }
    let lib = locate_lib(None)?;
    let tenant = vgpu_sim::locate_artifact("vgpu-demo-tenant")
        .context("vgpu-demo-tenant not found (cargo build -p vgpu-preload)")?;
    let opts = vgpu_sim::SimOptions::default();
    let phys = opts.config.device.memory_bytes;
    let sim = vgpu_sim::SimHandle::start(opts).context("starting the simulated GPU")?;
    let dir = private_dir("vgpu-demo")?;
    let budget_s = budget.to_string();

    // alice asks for 3/4 of her budget less the context; bob for 1.5x his.
    let ctx = 256u64 << 20;
    let plan: [(&'static str, u64); 2] = [
        ("alice", ((budget - ctx) / 4 * 3) & !((256 << 20) - 1)),
        ("bob", budget / 2 * 3),
    ];
    let mut tenants = Vec::new();
    for (name, target) in plan {
        let region = dir.join(format!("{name}.cache"));
        let mut env = sim.env();
        env.extend(preload_env(&lib, &region, Some(&budget_s), None, &[]));
        env.push(("LIBVGPU_CONTEXT_MEMORY".into(), ctx.to_string()));
        // The report says what was refused; keep the library's own
        // warning lines out of it unless asked for.
        if std::env::var_os("LIBCUDA_LOG_LEVEL").is_none() {
            env.push(("LIBCUDA_LOG_LEVEL".into(), "1".into()));
        }
        tenants.push(Tenant::spawn(name, target, &tenant, env, region)?);
    }
    let mut ok = true;
    for t in &mut tenants {
        t.read_until("holding")?;
    }
    let ledger: Vec<String> = tenants
        .iter()
        .map(|t| ledger_line(t.name, &t.region))
        .collect();
    for t in &mut tenants {
        drop(t.stdin.take());
        let _ = t.read_until("done");
        let st = t.child.wait()?;
        ok &= st.success();
    }

    println!("vgpu demo: two tenants share one simulated GPU (vgpu-sim test double, {}); each container has a {} budget.", gib(phys), gib(budget));
    println!(
        "Each process is also charged a {} context estimate (LIBVGPU_CONTEXT_MEMORY).\n",
        gib(ctx)
    );
    println!(
        "  {:<6} {:>10} {:>10} {:>12}   {:<24} {:<24}",
        "tenant", "asked", "granted", "refused ask", "cuMemGetInfo total/free", "NVML total/used"
    );
    for t in &tenants {
        let refused = t.num("refused.bytes");
        let refused_s = if refused == 0 {
            "-".to_string()
        } else {
            gib(refused)
        };
        println!(
            "  {:<6} {:>10} {:>10} {:>12}   {:<24} {:<24}",
            t.name,
            gib(t.target),
            gib(t.num("allocated")),
            refused_s,
            format!(
                "{} / {}",
                gib(t.num("after.total")),
                gib(t.num("after.free"))
            ),
            format!("{} / {}", gib(t.num("nvml.total")), gib(t.num("nvml.used"))),
        );
    }
    println!("\n  Ledger while both held their memory (`vgpu inspect <region>` shows the same):");
    for l in &ledger {
        println!("{l}");
    }
    let (a, b) = (&tenants[0], &tenants[1]);
    let a_ok = a.num("allocated") == a.target && a.num("refused.bytes") == 0;
    let b_ok = b.num("refused.bytes") > 0 && b.num("allocated") + ctx <= budget;
    let views_ok = tenants.iter().all(|t| {
        t.num("after.total") == budget.min(phys) && t.num("nvml.total") == budget.min(phys)
    });
    println!();
    if a_ok {
        println!("  alice stayed under her budget: every allocation granted.");
    }
    if b_ok {
        println!(
            "  bob was refused with CUDA_ERROR_OUT_OF_MEMORY when {} more would have crossed {} (granted {} + {} context).",
            gib(b.num("refused.bytes")),
            gib(budget),
            gib(b.num("allocated")),
            gib(ctx)
        );
    }
    if views_ok {
        println!(
            "  Both see a {} GPU in cuMemGetInfo and NVML, with their own usage only.",
            gib(budget.min(phys))
        );
    }
    drop(sim);
    if args.keep {
        println!("  regions kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if ok && a_ok && b_ok && views_ok {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("vgpu demo: the outcome was not as expected (see above)");
        Ok(ExitCode::from(1))
    }
}
