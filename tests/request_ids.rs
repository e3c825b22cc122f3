//! Every call's answer names its request id (`floret-request-id`): the one
//! the caller gave, when usable, else one the node made up; refusals too,
//! so a client's error can be found in the node's log.

use floret_proto::v1::{self, floret_client::FloretClient};
use tonic::Request;
use tonic::metadata::MetadataMap;

use super::harness::FloretProcess;

fn request_id(metadata: &MetadataMap) -> String {
    metadata
        .get("floret-request-id")
        .expect("a floret-request-id in the answer")
        .to_str()
        .unwrap()
        .to_owned()
}

fn produce(queue: &str, given_id: Option<&str>) -> Request<v1::ProduceRequest> {
    let mut request = Request::new(v1::ProduceRequest {
        queue: queue.to_owned(),
        producer_id: "p".to_owned(),
        messages: vec![v1::Message {
            payload: b"hello".to_vec(),
            headers: Default::default(),
        }],
        ..Default::default()
    });
    if let Some(id) = given_id {
        request
            .metadata_mut()
            .insert("floret-request-id", id.parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_or_a_refusal_could_not_be_found_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let node = FloretProcess::start(&dir.path().join("node"), &[]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = FloretClient::new(channel);

    let answer = client
        .produce(produce("q", Some("checkout-42")))
        .await
        .unwrap();
    assert_eq!(request_id(answer.metadata()), "checkout-42");

    let first = client.produce(produce("q", None)).await.unwrap();
    let second = client.produce(produce("q", None)).await.unwrap();
    let (first, second) = (request_id(first.metadata()), request_id(second.metadata()));
    assert_eq!(first.len(), 16, "made up: {first}");
    assert_ne!(first, second, "each call its own id");

    let refused = client
        .produce(produce("no spaces allowed", Some("bad-queue-call")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(request_id(refused.metadata()), "bad-queue-call");
}
