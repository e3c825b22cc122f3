//! The node's gRPC services and the conversions at their edge.

pub mod admin;
mod convert;
pub mod floret;
pub mod status;
