//! The client's produce linger against a fake node: calls that trickle in
//! while a request to the node is in flight wait (up to the linger) and go
//! together, and a call to a node with nothing in flight leaves at once.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floret_client::{Client, Message, ProduceCoalescing};
use floret_proto::v1::{self, floret_server::Floret, floret_server::FloretServer};
use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

/// Answers `Produce` only once its gate opens, `ProduceMany` at once, and
/// records the requests it got.
struct GatedNode {
    gate: watch::Receiver<bool>,
    requests: Arc<Mutex<Vec<Seen>>>,
}

/// A request the node got: a plain produce, or a `ProduceMany` of this many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Produce,
    Many(usize),
}

type Replies<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn produced() -> v1::ProduceResponse {
    v1::ProduceResponse {
        sequences: vec![0],
        duplicate: false,
        leader_address: String::new(),
    }
}

#[tonic::async_trait]
impl Floret for GatedNode {
    async fn produce(
        &self,
        _: Request<v1::ProduceRequest>,
    ) -> Result<Response<v1::ProduceResponse>, Status> {
        self.requests.lock().unwrap().push(Seen::Produce);
        let mut gate = self.gate.clone();
        gate.wait_for(|open| *open)
            .await
            .map_err(|_| Status::unavailable("the test ended"))?;
        Ok(Response::new(produced()))
    }

    type ProduceManyStream = Replies<v1::ProduceManyReply>;

    async fn produce_many(
        &self,
        request: Request<v1::ProduceManyRequest>,
    ) -> Result<Response<Self::ProduceManyStream>, Status> {
        let count = request.into_inner().produces.len();
        self.requests.lock().unwrap().push(Seen::Many(count));
        let outcomes = (0..count as u32)
            .map(|index| v1::ProduceOutcome {
                index,
                result: Some(v1::produce_outcome::Result::Produced(produced())),
            })
            .collect();
        let reply = v1::ProduceManyReply { outcomes };
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(reply)]))))
    }

    type ConsumeStream = Replies<v1::ConsumeResponse>;

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

/// A fake node on a port of its own; dropping `stop` ends it.
struct FakeNode {
    address: SocketAddr,
    gate: watch::Sender<bool>,
    requests: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeNode {
    async fn start(gate_open: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (gate, gate_seen) = watch::channel(gate_open);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let node = GatedNode {
            gate: gate_seen,
            requests: requests.clone(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(FloretServer::new(node))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            address,
            gate,
            requests,
            stop: Some(stop),
            server,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.requests.lock().unwrap().clone()
    }

    async fn stop(mut self) {
        let _ = self.gate.send(true);
        let _ = self.stop.take().map(|stop| stop.send(()));
        self.server.await.unwrap();
    }
}

fn client_lingering(node: &FakeNode, linger: Duration) -> Client {
    Client::connect_lazy(&node.address.to_string())
        .unwrap()
        .with_produce_coalescing(ProduceCoalescing {
            linger,
            ..ProduceCoalescing::default()
        })
}

fn one_message() -> Vec<Message> {
    vec![Message {
        payload: b"m".to_vec(),
        headers: Default::default(),
    }]
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_trickling_in_behind_a_request_in_flight_go_together_in_one_request() {
    let node = FakeNode::start(false).await;
    let client = client_lingering(&node, Duration::from_millis(500));
    let held = {
        let client = client.clone();
        tokio::spawn(async move { client.produce("default", "first", one_message()).await })
    };
    wait_until("the first call reached the node", || {
        node.seen() == [Seen::Produce]
    })
    .await;
    let mut trickling = Vec::new();
    for call in 0..10 {
        let client = client.clone();
        trickling.push(tokio::spawn(async move {
            client
                .produce("default", &format!("p{call}"), one_message())
                .await
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_until("every call reached the node", || {
        let calls = node.seen().into_iter().map(|seen| match seen {
            Seen::Produce => 1,
            Seen::Many(count) => count,
        });
        calls.sum::<usize>() == 11
    })
    .await;
    assert_eq!(
        node.seen(),
        [Seen::Produce, Seen::Many(10)],
        "the calls made while the first was in flight went in one request"
    );
    node.gate.send(true).unwrap();
    for call in trickling {
        call.await.unwrap().expect("answered");
    }
    held.await.unwrap().expect("the first call is answered too");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_an_idle_node_does_not_wait_for_the_linger() {
    let node = FakeNode::start(true).await;
    let client = client_lingering(&node, Duration::from_secs(60));
    tokio::time::timeout(
        Duration::from_secs(10),
        client.produce("default", "alone", one_message()),
    )
    .await
    .expect("a lone call leaves at once, not after the 60 s linger")
    .expect("answered");
    assert_eq!(node.seen(), [Seen::Produce]);
    node.stop().await;
}
