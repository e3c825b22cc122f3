//! `floret cluster`: changes of members. `add-node` makes a node a member
//! (start it with `--join` before or after), `remove-node` takes one out,
//! alive or dead; both print the members once the change is committed,
//! and the shards then move (watch them with `floret status`).

use crate::DEFAULT_ADDRESS;

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Make a node a member; the shards the ring gives it move to it.
    AddNode {
        /// The new node's id (its --node-id).
        #[arg(long)]
        id: u64,
        /// Where the other nodes dial it: its peer port, host:port.
        #[arg(long)]
        peer_addr: String,
        /// A member to ask.
        #[arg(long, default_value = DEFAULT_ADDRESS)]
        addr: String,
    },
    /// Take a member out, alive or dead; its shards move to the others.
    RemoveNode {
        /// The member's id.
        id: u64,
        /// A member to ask.
        #[arg(long, default_value = DEFAULT_ADDRESS)]
        addr: String,
    },
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let membership = match args.command {
        ClusterCommand::AddNode {
            id,
            peer_addr,
            addr,
        } => crate::dial(&addr)?.add_node(id, &peer_addr).await?,
        ClusterCommand::RemoveNode { id, addr } => crate::dial(&addr)?.remove_node(id).await?,
    };
    println!("{}", crate::status::members_line(Some(&membership)));
    Ok(())
}
