//! `floret health`: whether a node serves (gRPC health), as an exit code,
//! for probes that cannot speak TLS themselves (Kubernetes' gRPC probe).

use crate::DEFAULT_ADDRESS;

#[derive(clap::Args)]
pub struct HealthArgs {
    /// Node to ask.
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    addr: String,
}

/// Prints SERVING and succeeds, or fails saying why not.
pub async fn run(args: HealthArgs) -> anyhow::Result<()> {
    let serving = crate::dial(&args.addr)?.serving().await?;
    anyhow::ensure!(serving, "node {} is NOT_SERVING", args.addr);
    println!("SERVING");
    Ok(())
}
