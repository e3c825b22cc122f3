//! The web console in a real browser: a node serves it while three
//! producers' messages are delivered; headless Chromium (Debian's
//! `chromium` and `chromium-driver`, which `.ci/run` installs) opens the
//! page through chromedriver, and the test asserts that the producers are
//! listed and that the chart of their shares moves on. The screenshot is
//! saved as `console.png` in the test's output directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use floret_client::{ConsumerEvent, Message};
use serde_json::{Value, json};

use super::harness::FloretProcess;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const PRODUCERS: [&str; 3] = ["flood", "quiet-1", "quiet-2"];
/// Samples (one a second) the chart shows before the screenshot.
const CHART_SAMPLES: u64 = 6;

/// A chromedriver process, ended when dropped.
struct Driver {
    process: Child,
    address: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Driver {
    fn start() -> Self {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(program).exists(),
                "{program} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
            );
        }
        let port = floret_chaos::ports::free_loopback_ports(1).unwrap()[0];
        let process = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let driver = Self {
            process,
            address: format!("127.0.0.1:{port}"),
        };
        let listening = wait_until(Duration::from_secs(20), || {
            TcpStream::connect(&driver.address).ok()
        });
        assert!(listening.is_ok(), "chromedriver did not listen");
        driver
    }

    /// One WebDriver call: its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|body| body.to_string()).unwrap_or_default();
        let mut stream = TcpStream::connect(&self.address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .unwrap();
        let (head, json) = read_answer(&mut stream);
        let value: Value = serde_json::from_str(&json)
            .unwrap_or_else(|error| panic!("{method} {path}: {error}: {head}\r\n\r\n{json}"));
        assert!(head.starts_with("HTTP/1.1 200"), "{method} {path}: {value}");
        value["value"].clone()
    }
}

/// One HTTP answer's head and body, read as far as its length says
/// (chromedriver keeps connections open).
fn read_answer(stream: &mut TcpStream) -> (String, String) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let read = stream.read(&mut buffer).unwrap();
        assert!(read > 0, "chromedriver closed the connection mid-answer");
        received.extend_from_slice(&buffer[..read]);
    };
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("chromedriver answers with a Content-Length");
    let mut body = received[head_end + 4..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut buffer).unwrap();
        assert!(read > 0, "chromedriver closed the connection mid-answer");
        body.extend_from_slice(&buffer[..read]);
    }
    (head, String::from_utf8(body).unwrap())
}

/// What `probe` finds, asked every 250 ms until it finds something or
/// `within` has passed (from a blocking thread: the browser calls block).
fn wait_until<T>(within: Duration, mut probe: impl FnMut() -> Option<T>) -> Result<T, ()> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = probe() {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            return Err(());
        }
        std::thread::park_timeout(Duration::from_millis(250));
    }
}

/// A browser session, deleted when dropped.
struct Session<'a> {
    driver: &'a Driver,
    id: String,
}

impl<'a> Session<'a> {
    fn open(driver: &'a Driver) -> Self {
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1400"]
            }
        }}});
        let value = driver.call("POST", "/session", Some(capabilities));
        Self {
            driver,
            id: value["sessionId"].as_str().unwrap().to_owned(),
        }
    }

    fn go(&self, url: &str) {
        self.driver.call(
            "POST",
            &format!("/session/{}/url", self.id),
            Some(json!({ "url": url })),
        );
    }

    fn run(&self, script: &str) -> Value {
        self.driver.call(
            "POST",
            &format!("/session/{}/execute/sync", self.id),
            Some(json!({ "script": script, "args": [] })),
        )
    }

    fn screenshot(&self) -> Vec<u8> {
        let encoded = self
            .driver
            .call("GET", &format!("/session/{}/screenshot", self.id), None);
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            self.driver
                .call("DELETE", &format!("/session/{}", self.id), None)
        });
    }
}

/// What the page shows: its producer rows and the chart's samples.
const READ_PAGE: &str = r##"
    const chart = document.getElementById("share-chart");
    return {
        producers: [...document.querySelectorAll("#producers tr[data-producer]")]
            .map(row => row.dataset.producer),
        samples: Number(chart.dataset.samples),
        lines: [...chart.querySelectorAll("polyline")].map(line => line.getAttribute("points")),
        status: document.getElementById("status").textContent,
    };
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_did_not_show_the_producers_or_a_live_share_chart() {
    let dir = tempfile::tempdir().unwrap();
    let port = floret_chaos::ports::free_loopback_ports(1).unwrap()[0];
    let console = format!("127.0.0.1:{port}");
    let node = FloretProcess::start(&dir.path().join("node"), &["--metrics-listen", &console]);
    let client = node.client();
    for producer in PRODUCERS {
        let messages = (0..500)
            .map(|n| Message {
                payload: format!("{producer} {n}").into_bytes(),
                headers: Default::default(),
            })
            .collect();
        client.produce("q", producer, messages).await.unwrap();
    }
    // A slow consumer, so that the backlog lasts and shares keep moving.
    let mut consumer = client.consume("q", 10).await.unwrap();
    let consuming = tokio::spawn(async move {
        while let Ok(Some(event)) = consumer.next().await {
            if let ConsumerEvent::Delivery(delivery) = event {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let acked = consumer.ack(vec![delivery.delivery_id]).await;
                if acked.is_err() || consumer.credit(1).await.is_err() {
                    return;
                }
            }
        }
    });

    let shown = tokio::task::spawn_blocking(move || {
        let driver = Driver::start();
        let session = Session::open(&driver);
        session.go(&format!("http://{console}/"));
        let first = wait_until(Duration::from_secs(30), || {
            let page = session.run(READ_PAGE);
            let listed = page["producers"].as_array().map_or(0, Vec::len);
            (listed == PRODUCERS.len() && page["samples"].as_u64() >= Some(2)).then_some(page)
        })
        .unwrap_or_else(|()| {
            panic!(
                "the page did not list the producers: {}",
                session.run(READ_PAGE)
            )
        });
        let later = wait_until(Duration::from_secs(20), || {
            let page = session.run(READ_PAGE);
            (page["samples"].as_u64() >= Some(CHART_SAMPLES) && page["lines"] != first["lines"])
                .then_some(page)
        })
        .unwrap_or_else(|()| {
            panic!(
                "the chart did not move: {first} then {}",
                session.run(READ_PAGE)
            )
        });
        let screenshot = session.screenshot();
        (first, later, screenshot)
    })
    .await
    .unwrap();
    consuming.abort();

    let (first, later, screenshot) = shown;
    let mut listed: Vec<&str> = first["producers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|producer| producer.as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, PRODUCERS);
    assert_eq!(
        later["lines"].as_array().unwrap().len(),
        PRODUCERS.len(),
        "one line per producer: {later}"
    );
    assert!(screenshot.starts_with(b"\x89PNG"), "a PNG screenshot");
    let saved = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console.png");
    std::fs::write(&saved, &screenshot).unwrap();
    eprintln!("console screenshot: {}", saved.display());
}
