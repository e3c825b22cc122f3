//! A node of an older version, without `ProduceMany`: the client's
//! coalesced produce calls must still all go through, one by one.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use floret_client::{Client, Message};
use floret_proto::v1::{self, floret_server::Floret, floret_server::FloretServer};
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

/// Takes `Produce` and nothing else, as a node from before `ProduceMany`.
#[derive(Default)]
struct OlderNode {
    next_sequence: AtomicU64,
    produce_many_calls: Arc<AtomicU64>,
}

type Never<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Floret for OlderNode {
    async fn produce(
        &self,
        request: Request<v1::ProduceRequest>,
    ) -> Result<Response<v1::ProduceResponse>, Status> {
        let count = request.into_inner().messages.len() as u64;
        let first = self.next_sequence.fetch_add(count, Ordering::Relaxed);
        Ok(Response::new(v1::ProduceResponse {
            sequences: (first..first + count).collect(),
            duplicate: false,
            leader_address: String::new(),
        }))
    }

    type ProduceManyStream = Never<v1::ProduceManyReply>;

    async fn produce_many(
        &self,
        _: Request<v1::ProduceManyRequest>,
    ) -> Result<Response<Self::ProduceManyStream>, Status> {
        self.produce_many_calls.fetch_add(1, Ordering::Relaxed);
        Err(Status::unimplemented("ProduceMany is not known here"))
    }

    type ConsumeStream = Never<v1::ConsumeResponse>;

    async fn consume(
        &self,
        _: Request<Streaming<v1::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn ack(&self, _: Request<v1::AckRequest>) -> Result<Response<v1::AckResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_produces_fail_against_a_node_without_produce_many() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address: SocketAddr = listener.local_addr().unwrap();
    let node = OlderNode::default();
    let produce_many_calls = node.produce_many_calls.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(FloretServer::new(node))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let client = Client::connect_lazy(&address.to_string()).unwrap();
    let calls: Vec<_> = (0..300u64)
        .map(|call| {
            let client = client.clone();
            tokio::spawn(async move {
                let message = Message {
                    payload: call.to_le_bytes().to_vec(),
                    headers: Default::default(),
                };
                client.produce("default", "p", vec![message]).await
            })
        })
        .collect();
    let mut sequences = Vec::new();
    for call in calls {
        let answer = call.await.unwrap().expect("every call goes through");
        sequences.extend(answer.sequences);
    }
    sequences.sort_unstable();
    sequences.dedup();
    assert_eq!(sequences.len(), 300, "each call stored once");
    let tried = produce_many_calls.load(Ordering::Relaxed);
    assert!(
        tried >= 1,
        "the calls were never folded: the test shows nothing"
    );
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
