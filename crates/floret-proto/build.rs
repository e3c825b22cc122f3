//! Compiles `proto/` with protox (pure Rust, so no system `protoc` is needed),
//! writes the descriptor set for server reflection (of `floret.v1` alone, so
//! the client port never advertises the peer API),
//! and generates the tonic code.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        proto_root.join("floret/v1/floret.proto"),
        proto_root.join("floret/peer/v1/peer.proto"),
        proto_root.join("floret/sink/v1/sink.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let public = protox::compile(&files[..1], [&proto_root])?;
    std::fs::write(
        out_dir.join("floret_public_descriptor.bin"),
        prost::Message::encode_to_vec(&public),
    )?;
    let descriptors = protox::compile(&files, [&proto_root])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
