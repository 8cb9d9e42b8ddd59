//! `vgpu scheduler`: the Kubernetes scheduler extender and mutating
//! admission webhook (docs/scheduler.md). Flags keep HAMi's scheduler
//! names (`--http_bind`, `--cert_file`, `--scheduler-name`, ...) so its
//! Deployment arguments carry over; SIGTERM or SIGINT stops it.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use vgpu_scheduler::config::{GpuPolicy, NodePolicy, SchedulerConfig};
use vgpu_scheduler::run::{self, RunOptions};
use vgpu_scheduler::scheduler::Scheduler;
use vgpu_scheduler::server::TlsFiles;

#[derive(clap::Args)]
pub struct Args {
    /// Extender and webhook address (HTTPS with --cert-file/--key-file).
    #[arg(long, aliases = ["http_bind", "listen"], default_value = "127.0.0.1:8080")]
    http_bind: SocketAddr,
    /// TLS certificate chain (PEM).
    #[arg(long, alias = "cert_file", requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, alias = "key_file", requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// Metrics address (`:9395` = all interfaces); `off` disables.
    #[arg(long, alias = "metrics", default_value = ":9395")]
    metrics_bind_address: String,
    /// HAMi's pre-2.9 metric names, beside the new ones.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    legacy_metrics: bool,
    /// Written into spec.schedulerName of GPU pods by the webhook ("" leaves it).
    #[arg(long, default_value = "hami-scheduler")]
    scheduler_name: String,
    /// Node policy when a pod names none: binpack or spread.
    #[arg(long, default_value = "binpack", value_parser = parse_node_policy)]
    node_scheduler_policy: NodePolicy,
    /// GPU policy when a pod names none: binpack or spread.
    #[arg(long, default_value = "spread", value_parser = parse_gpu_policy)]
    gpu_scheduler_policy: GpuPolicy,
    /// The webhook also takes pods whose schedulerName is default-scheduler.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    force_overwrite_default_scheduler: bool,
    /// HAMi's device-config.yaml (its `nvidia:` resource names and defaults).
    #[arg(long)]
    device_config_file: Option<PathBuf>,
    /// Resource names (HAMi's chart values resourceName, resourceMem,
    /// resourceMemPercentage, resourceCores, resourcePriority); they win
    /// over --device-config-file.
    #[arg(long, value_name = "NAME")]
    resource_name: Option<String>,
    #[arg(long, value_name = "NAME")]
    resource_mem: Option<String>,
    #[arg(long, value_name = "NAME")]
    resource_mem_percentage: Option<String>,
    #[arg(long, value_name = "NAME")]
    resource_cores: Option<String>,
    #[arg(long, value_name = "NAME")]
    resource_priority: Option<String>,
    /// Only nodes with these labels (`k=v,k2=v2`; repeated flags add up).
    #[arg(long)]
    node_label_selector: Vec<String>,
    /// A node lock older than this is broken (Go duration; HAMI_NODELOCK_EXPIRE too).
    #[arg(long, alias = "node-lock-timeout", env = "HAMI_NODELOCK_EXPIRE", default_value = "5m", value_parser = parse_duration)]
    node_lock_expire: Duration,
    /// How long a bind waits for another pod's node lock before failing
    /// (HAMi's --node-lock-retry-timeout and its default: under the
    /// extender's 30 s httpTimeout).
    #[arg(long, alias = "node-lock-retry-timeout", default_value = NODE_LOCK_WAIT_DEFAULT, value_parser = parse_duration)]
    node_lock_wait: Duration,
    /// How often GPU nodes get HAMi's handshake request (0s: never).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    handshake_period: Duration,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "info")]
    log_level: tracing::Level,
    /// HAMi's leader election flags are accepted and ignored: every
    /// replica serves (binds are made safe by the node lock).
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: Option<String>,
    #[arg(long, hide = true)]
    leader_elect_resource_name: Option<String>,
    #[arg(long, hide = true)]
    leader_elect_resource_namespace: Option<String>,
    /// HAMi's client and logging flags (its chart passes `--debug -v=4`):
    /// accepted and ignored.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true")]
    debug: Option<String>,
    #[arg(short = 'v', hide = true)]
    klog_verbosity: Option<String>,
    #[arg(long, hide = true)]
    kube_qps: Option<String>,
    #[arg(long, hide = true)]
    kube_burst: Option<String>,
    #[arg(long, hide = true)]
    kube_timeout: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true")]
    profiling: Option<String>,
}

/// HAMi's `--node-lock-retry-timeout` default (28 s): a bind that waits
/// this long still answers inside kube-scheduler's 30 s extender
/// `httpTimeout` (the chart's and HAMi's), so the pod gets the lock error
/// instead of a timeout.
const NODE_LOCK_WAIT_DEFAULT: &str = "28s";

fn parse_node_policy(s: &str) -> Result<NodePolicy, String> {
    NodePolicy::parse(s).ok_or_else(|| format!("{s:?}: expected binpack or spread"))
}

fn parse_gpu_policy(s: &str) -> Result<GpuPolicy, String> {
    GpuPolicy::parse(s).ok_or_else(|| format!("{s:?}: expected binpack or spread"))
}

/// Go's `time.ParseDuration` forms: `300ms`, `30s`, `5m`, `1h30m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?}: expected a duration like 30s, 5m, 1h30m");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..n_end].parse().map_err(|_| bad())?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &rest[u_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// `:9395` means every interface, as Go's net.Listen reads it.
fn parse_addr(s: &str) -> anyhow::Result<SocketAddr> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .with_context(|| format!("{s:?} is not an address like :9395 or 127.0.0.1:9395"))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_max_level(args.log_level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut cfg = SchedulerConfig {
        scheduler_name: args.scheduler_name.clone(),
        node_policy: args.node_scheduler_policy,
        gpu_policy: args.gpu_scheduler_policy,
        force_overwrite_default_scheduler: args.force_overwrite_default_scheduler,
        node_lock_expiry: args.node_lock_expire,
        node_lock_wait: args.node_lock_wait,
        ..SchedulerConfig::default()
    };
    if let Some(path) = &args.device_config_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        cfg.apply_device_config(&text)
            .with_context(|| format!("in {}", path.display()))?;
    }
    let r = &mut cfg.resources;
    for (slot, flag) in [
        (&mut r.count, &args.resource_name),
        (&mut r.memory, &args.resource_mem),
        (&mut r.memory_percentage, &args.resource_mem_percentage),
        (&mut r.cores, &args.resource_cores),
        (&mut r.priority, &args.resource_priority),
    ] {
        if let Some(name) = flag {
            *slot = name.clone();
        }
    }
    let metrics = match args.metrics_bind_address.as_str() {
        "off" | "" | "0" => None,
        a => Some(parse_addr(a)?),
    };
    let tls = match (&args.cert_file, &args.key_file) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let client = kube::Client::try_default().await.context(
            "connecting to the Kubernetes API (in-cluster service account or KUBECONFIG)",
        )?;
        let s = Scheduler::new(client, cfg, args.legacy_metrics);
        let running = run::start(
            s,
            RunOptions {
                listen: args.http_bind,
                metrics,
                tls,
                node_label_selector: (!args.node_label_selector.is_empty())
                    .then(|| args.node_label_selector.join(",")),
                handshake_period: (!args.handshake_period.is_zero())
                    .then_some(args.handshake_period),
            },
        )
        .await?;
        let scheme = if args.cert_file.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(
            "vgpu scheduler: extender and webhook on {scheme}://{}",
            running.listen
        );
        if let Some(m) = running.metrics {
            tracing::info!("vgpu scheduler: metrics on http://{m}/metrics");
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("vgpu scheduler: stopping");
        drop(running);
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn node_lock_wait_is_hamis_retry_timeout() {
        use clap::Parser;
        // HAMi v2.10's --node-lock-retry-timeout default, the library's too.
        let a = Cli::parse_from(["scheduler"]).args;
        assert_eq!(a.node_lock_wait, Duration::from_secs(28));
        assert_eq!(SchedulerConfig::default().node_lock_wait, a.node_lock_wait);
        // HAMi's spelling, HAMi's chart arguments, repeated label selectors.
        let a = Cli::parse_from([
            "scheduler",
            "--node-lock-retry-timeout=5s",
            "--node-label-selector=gpu=on",
            "--node-label-selector=pool=a,zone=b",
            "--leader-elect=true",
            "--debug",
            "-v=4",
        ])
        .args;
        assert_eq!(a.node_lock_wait, Duration::from_secs(5));
        assert_eq!(a.node_label_selector.join(","), "gpu=on,pool=a,zone=b");
    }

    #[test]
    fn go_durations_and_addresses() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("five minutes").is_err());
        assert_eq!(
            parse_addr(":9395").unwrap(),
            "0.0.0.0:9395".parse().unwrap()
        );
        assert!(parse_addr("nowhere").is_err());
    }
}
