//! The Admin calls on sinks: set and remove commit in every shard (each
//! shard's leader pumps its own messages, so each needs the sink), get
//! reads a replica this node holds.
//!
//! IMPLEMENTATION CAVEATS
//! - A change some shards could not commit is UNAVAILABLE; the shards that
//!   did keep it (setting it again is harmless), and their leaders pump
//!   into it meanwhile.
//! - A node holding no replica (possible with more nodes than the
//!   replication factor and few shards) answers GetSink UNAVAILABLE.

use floret_proto::v1;
use floret_store::{Op, OpReply, SetSink, ShardId, SinkSpec};
use tonic::{Response, Status};

use super::AdminService;
use crate::error::RequestError;
use crate::request;
use crate::sink::spec;

impl AdminService {
    pub(super) async fn set_sink_in_shards(
        &self,
        request: v1::SetSinkRequest,
    ) -> Result<Response<v1::SetSinkResponse>, Status> {
        let queue = request::queue_name(&request.queue)?;
        let sink = spec::from_wire(request.sink)?;
        self.commit_sink_everywhere(queue, Some(sink.clone()))
            .await?;
        Ok(Response::new(v1::SetSinkResponse {
            stored: Some(spec::to_wire(sink)),
        }))
    }

    pub(super) async fn remove_sink_in_shards(
        &self,
        request: v1::RemoveSinkRequest,
    ) -> Result<Response<v1::RemoveSinkResponse>, Status> {
        let queue = request::queue_name(&request.queue)?;
        let removed = self.commit_sink_everywhere(queue, None).await?;
        Ok(Response::new(v1::RemoveSinkResponse { removed }))
    }

    pub(super) fn sink_from_own_replica(
        &self,
        request: v1::GetSinkRequest,
    ) -> Result<Response<v1::GetSinkResponse>, Status> {
        let queue = request::queue_name(&request.queue)?;
        let Some(group) = self.shards.groups().next() else {
            return Err(Status::from(RequestError::unavailable(format!(
                "node {} holds no shard replica; ask another node",
                self.shards.node_id()
            ))));
        };
        let sinks = group.reader.sinks().map_err(|error| {
            Status::from(RequestError::Internal(format!(
                "cannot read the sinks of shard {}: {error}",
                group.id
            )))
        })?;
        let sink = sinks
            .into_iter()
            .find_map(|(stored, sink)| (stored == queue).then_some(sink));
        Ok(Response::new(v1::GetSinkResponse {
            sink: sink.map(spec::to_wire),
        }))
    }

    /// Commits `sink` (None: no sink) for `queue` in every shard; whether
    /// any shard had one before.
    async fn commit_sink_everywhere(
        &self,
        queue: String,
        sink: Option<SinkSpec>,
    ) -> Result<bool, Status> {
        let shards: Vec<ShardId> = (0..self.shards.placement().shard_count()).collect();
        let change = SetSink { queue, sink };
        let results = futures::future::join_all(shards.iter().map(|&shard| {
            let op = Op::SetSink(change.clone());
            async move { (shard, self.router.commit(shard, op).await) }
        }))
        .await;
        let mut had_one = false;
        let mut failed = Vec::new();
        for (shard, result) in results {
            match result {
                Ok(OpReply::SinkSet { had_one: had, .. }) => had_one |= had,
                Ok(other) => failed.push(format!("shard {shard} answered {other:?}")),
                Err(error) => failed.push(format!("shard {shard}: {error}")),
            }
        }
        if let Some(first) = failed.first() {
            return Err(Status::from(RequestError::unavailable(format!(
                "the sink was committed in {} of {} shards (first failure: {first}); set it again, which is harmless",
                shards.len() - failed.len(),
                shards.len()
            ))));
        }
        Ok(had_one)
    }
}
