//! Tests of the tunnel: the mux over in-memory sockets (two tunnels, or a tunnel against a raw
//! WebSocket driven by hand), and the handshake over loopback HTTP.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::frame::{self, encode};
use super::*;

/// The generous bound on anything that should happen at once.
const WAIT: Duration = Duration::from_secs(5);

fn settings() -> Settings {
    Settings { max_frame: 64 * 1024, window: 8, heartbeat: Duration::from_secs(30) }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: not within {WAIT:?}"),
    }
}

fn stdio(server: &str) -> Open {
    Open::Stdio {
        server: server.to_owned(),
        command: "cat".to_owned(),
        args: vec![],
        env: BTreeMap::new(),
        cwd: "file:///tmp".to_owned(),
    }
}

async fn sockets(settings: &Settings) -> (WebSocketStream<DuplexStream>, WebSocketStream<DuplexStream>) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let server = WebSocketStream::from_raw_socket(a, Role::Server, Some(ws_config(settings))).await;
    let client = WebSocketStream::from_raw_socket(b, Role::Client, Some(ws_config(settings))).await;
    (server, client)
}

struct Pair {
    gateway: TunnelHandle,
    _gateway_incoming: Incoming,
    agent: TunnelHandle,
    incoming: Incoming,
}

async fn pair(settings: Settings) -> Pair {
    let (server, client) = sockets(&settings).await;
    let (gateway, gateway_incoming) = start(server, Side::Gateway, settings.clone());
    let (agent, incoming) = start(client, Side::Agent, settings);
    Pair { gateway, _gateway_incoming: gateway_incoming, agent, incoming }
}

/// Accepts every open request and echoes each message back.
fn echo_agent(mut incoming: Incoming) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(pending) = incoming.next().await {
            let (tx, mut rx) = pending.accept().split();
            tokio::spawn(async move {
                while let Some(message) = rx.recv().await {
                    if tx.send(message).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// The next open request, accepted.
async fn accept_next(incoming: &mut Incoming) -> Channel {
    within("an open request", incoming.next()).await.expect("an open request").accept()
}

async fn open(gateway: &TunnelHandle, server: &str) -> Channel {
    within("open", gateway.open(&stdio(server), WAIT)).await.expect("the channel opens")
}

// ---- open, accept, refuse ----

#[tokio::test]
async fn an_open_accepted_carries_data_both_ways() {
    let pair = pair(settings()).await;
    let agent = echo_agent(pair.incoming);
    let (tx, mut rx) = open(&pair.gateway, "echo").await.split();
    tx.send(Bytes::from_static(b"hello")).await.unwrap();
    assert_eq!(within("the echo", rx.recv()).await.as_deref(), Some(&b"hello"[..]));
    assert_eq!(pair.gateway.channels_open(), 1);
    assert_eq!(pair.agent.channels_open(), 1);
    agent.abort();
}

#[tokio::test]
async fn the_open_request_arrives_whole() {
    let mut pair = pair(settings()).await;
    let sent = Open::Http {
        server: "crm".to_owned(),
        url: "https://crm.example/mcp".to_owned(),
        headers: BTreeMap::from([("x-api-key".to_owned(), "${CRM_KEY}".to_owned())]),
        assertion_header: "x-identity".to_owned(),
    };
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move { gateway.open(&sent, WAIT).await.map(|c| c.id()) });
    let pending = within("the open request", pair.incoming.next()).await.unwrap();
    assert!(
        matches!(&pending.open, Open::Http { server, headers, .. } if server == "crm" && headers["x-api-key"] == "${CRM_KEY}")
    );
    let agent_side = pending.accept();
    assert_eq!(within("open", opening).await.unwrap(), Ok(agent_side.id()));
}

#[tokio::test]
async fn a_refusal_reaches_the_gateway_with_its_reason() {
    let mut pair = pair(settings()).await;
    let agent = tokio::spawn(async move {
        let pending = pair.incoming.next().await.unwrap();
        pending.refuse("no server named nope");
        let dropped = pair.incoming.next().await.unwrap();
        drop(dropped);
        pair.incoming
    });
    let refused = pair.gateway.open(&stdio("nope"), WAIT).await.err();
    assert_eq!(refused, Some(TunnelError::Refused("no server named nope".to_owned())));
    // Dropping the request refuses it too.
    let dropped = pair.gateway.open(&stdio("other"), WAIT).await.err();
    assert!(matches!(&dropped, Some(TunnelError::Refused(reason)) if reason.contains("did not take")), "{dropped:?}");
    assert_eq!(pair.gateway.channels_open(), 0);
    assert_eq!(pair.agent.channels_open(), 0);
    drop(within("agent", agent).await);
}

#[tokio::test]
async fn an_open_without_an_answer_times_out_and_is_closed() {
    let mut pair = pair(settings()).await;
    let timeout = Duration::from_millis(100);
    let result = pair.gateway.open(&stdio("slow"), timeout).await.err();
    assert_eq!(result, Some(TunnelError::Timeout(timeout)));
    assert_eq!(pair.gateway.channels_open(), 0, "the timed-out channel is gone");
    // The agent accepts too late: the gateway's Close ends the channel there as well.
    let (tx, mut rx) = accept_next(&mut pair.incoming).await.split();
    assert_eq!(within("the late channel's end", rx.recv()).await, None);
    assert!(tx.send(Bytes::from_static(b"x")).await.is_err());
    assert!(!pair.gateway.is_closed(), "a late answer is no protocol error");
    assert_eq!(pair.agent.channels_open(), 0);
}

#[tokio::test]
async fn only_the_gateway_opens() {
    let pair = pair(settings()).await;
    let result = pair.agent.open(&stdio("x"), WAIT).await.err();
    assert!(matches!(result, Some(TunnelError::Refused(_))), "{result:?}");
    let mut incoming = pair._gateway_incoming;
    pair.gateway.close("done");
    assert!(within("the gateway's incoming", incoming.next()).await.is_none());
}

// ---- data and flow control ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_channels_carry_their_own_messages_in_order() {
    let pair = pair(settings()).await;
    let agent = echo_agent(pair.incoming);
    let mut calls = Vec::new();
    for c in 0..16u32 {
        let gateway = pair.gateway.clone();
        calls.push(tokio::spawn(async move {
            let (tx, mut rx) = gateway.open(&stdio(&format!("s{c}")), WAIT).await.unwrap().split();
            let writer = tokio::spawn(async move {
                for n in 0..300u32 {
                    tx.send(Bytes::from(format!("{c}:{n}"))).await.unwrap();
                }
                tx
            });
            for n in 0..300u32 {
                let message = rx.recv().await.expect("an echo");
                assert_eq!(message, Bytes::from(format!("{c}:{n}")), "channel {c}, message {n}");
            }
            drop(writer.await.unwrap());
        }));
    }
    for call in calls {
        within("a channel's echoes", call).await.unwrap();
    }
    agent.abort();
}

#[tokio::test]
async fn a_slow_reader_on_one_channel_does_not_stop_another() {
    let mut pair = pair(settings()).await;
    let window = settings().window;
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move {
        let a = gateway.open(&stdio("a"), WAIT).await.unwrap();
        let b = gateway.open(&stdio("b"), WAIT).await.unwrap();
        (a, b)
    });
    let (a_tx, _a_rx) = accept_next(&mut pair.incoming).await.split();
    let (b_tx, mut b_rx) = accept_next(&mut pair.incoming).await.split();
    let (a, b) = within("opens", opening).await.unwrap();
    // The agent floods A, whose reader on the gateway reads nothing yet.
    let flood = tokio::spawn(async move {
        for n in 0..3 * window {
            a_tx.send(Bytes::from(format!("a{n}"))).await.unwrap();
        }
    });
    let (b_gw_tx, mut b_gw_rx) = b.split();
    for n in 0..50 {
        b_gw_tx.send(Bytes::from(format!("b{n}"))).await.unwrap();
        let got = within("B's message", b_rx.recv()).await.unwrap();
        b_tx.send(got).await.unwrap();
        assert_eq!(within("B's echo", b_gw_rx.recv()).await.unwrap(), Bytes::from(format!("b{n}")));
    }
    assert!(!flood.is_finished(), "A's sender waits for credit");
    let (_a_gw_tx, mut a_gw_rx) = a.split();
    for n in 0..3 * window {
        assert_eq!(within("A's message", a_gw_rx.recv()).await.unwrap(), Bytes::from(format!("a{n}")));
    }
    within("A's flood", flood).await.unwrap();
}

#[tokio::test]
async fn a_sender_without_credit_waits_until_the_reader_reads() {
    let settings = Settings { window: 4, ..settings() };
    let mut pair = pair(settings).await;
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move { gateway.open(&stdio("s"), WAIT).await.unwrap() });
    let (_agent_tx, mut agent_rx) = accept_next(&mut pair.incoming).await.split();
    let (tx, _rx) = within("open", opening).await.unwrap().split();
    for n in 0..4u8 {
        within("a send within the window", tx.send(Bytes::from(vec![n]))).await.unwrap();
    }
    let blocked = tokio::time::timeout(Duration::from_millis(200), tx.send(Bytes::from(vec![4]))).await;
    assert!(blocked.is_err(), "the fifth send waits: the window is 4 and nothing was read");
    let waiting = tokio::spawn({
        let tx = tx.clone();
        async move { tx.send(Bytes::from(vec![4])).await }
    });
    // Reading half the window grants it back.
    for n in 0..2u8 {
        assert_eq!(within("a read", agent_rx.recv()).await.unwrap(), Bytes::from(vec![n]));
    }
    within("the waiting send", waiting).await.unwrap().unwrap();
    for n in 2..5u8 {
        assert_eq!(within("a read", agent_rx.recv()).await.unwrap(), Bytes::from(vec![n]));
    }
}

#[tokio::test]
async fn an_oversized_message_is_refused_and_the_channel_still_works() {
    let settings = Settings { max_frame: 1024, ..settings() };
    let pair = pair(settings).await;
    let agent = echo_agent(pair.incoming);
    let (tx, mut rx) = open(&pair.gateway, "s").await.split();
    let result = tx.send(Bytes::from(vec![b'x'; 1025])).await;
    assert_eq!(result, Err(TunnelError::TooLarge { size: 1025, max: 1024 }));
    let largest = Bytes::from(vec![b'y'; 1024]);
    tx.send(largest.clone()).await.unwrap();
    assert_eq!(within("the echo", rx.recv()).await, Some(largest));
    agent.abort();
}

// ---- the ends of channels and of the tunnel ----

#[tokio::test]
async fn dropping_a_channel_tells_the_peer() {
    let mut pair = pair(settings()).await;
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move { gateway.open(&stdio("s"), WAIT).await.unwrap() });
    let (_agent_tx, mut agent_rx) = accept_next(&mut pair.incoming).await.split();
    let channel = within("open", opening).await.unwrap();
    drop(channel);
    assert_eq!(within("the end", agent_rx.recv()).await, None);
    assert_eq!(agent_rx.close_reason(), Some(String::new()), "a normal end");
    assert_eq!(pair.gateway.channels_open(), 0);
    assert_eq!(pair.agent.channels_open(), 0);
}

#[tokio::test]
async fn a_receiver_dropped_alone_keeps_the_channel_and_stalls_nobody() {
    let mut pair = pair(settings()).await;
    let window = settings().window;
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move { gateway.open(&stdio("s"), WAIT).await.unwrap() });
    let (agent_tx, mut agent_rx) = accept_next(&mut pair.incoming).await.split();
    let (tx, rx) = within("open", opening).await.unwrap().split();
    agent_tx.send(Bytes::from_static(b"buffered")).await.unwrap();
    drop(rx);
    // Nobody reads on the gateway, yet the agent is never stalled: the credit comes back.
    for _ in 0..4 * window {
        within("a send to a channel nobody reads", agent_tx.send(Bytes::from_static(b"x"))).await.unwrap();
    }
    tx.send(Bytes::from_static(b"still open")).await.unwrap();
    assert_eq!(within("the gateway's message", agent_rx.recv()).await.as_deref(), Some(&b"still open"[..]));
    drop(tx);
    assert_eq!(within("the end", agent_rx.recv()).await, None);
}

#[tokio::test]
async fn closing_a_channel_sends_its_reason_and_is_final() {
    let mut pair = pair(settings()).await;
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move { gateway.open(&stdio("s"), WAIT).await.unwrap() });
    let (agent_tx, mut agent_rx) = accept_next(&mut pair.incoming).await.split();
    let (tx, mut rx) = within("open", opening).await.unwrap().split();
    agent_tx.send(Bytes::from_static(b"last")).await.unwrap();
    agent_tx.close("the server exited");
    assert!(agent_tx.send(Bytes::from_static(b"after")).await.is_err(), "Close is final here");
    assert_eq!(agent_rx.recv().await, None);
    // The peer still reads what came before the Close, then the end with its reason.
    assert_eq!(within("the last message", rx.recv()).await.as_deref(), Some(&b"last"[..]));
    assert_eq!(within("the end", rx.recv()).await, None);
    assert_eq!(rx.close_reason().as_deref(), Some("the server exited"));
    let error = tx.send(Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(error, TunnelError::Closed("the server exited".to_owned()));
}

#[tokio::test]
async fn the_end_of_the_tunnel_ends_every_channel() {
    let mut pair = pair(settings()).await;
    let gateway = pair.gateway.clone();
    let opening = tokio::spawn(async move {
        let mut channels = Vec::new();
        for n in 0..3 {
            channels.push(gateway.open(&stdio(&format!("s{n}")), WAIT).await.unwrap().split());
        }
        channels
    });
    let mut agent_channels = Vec::new();
    for _ in 0..3 {
        agent_channels.push(accept_next(&mut pair.incoming).await.split());
    }
    let gateway_channels = within("opens", opening).await.unwrap();
    assert_eq!((pair.gateway.channels_open(), pair.agent.channels_open()), (3, 3));
    pair.gateway.close("maintenance");
    assert_eq!(within("the gateway's end", pair.gateway.closed()).await, "maintenance");
    let agent_reason = within("the agent's end", pair.agent.closed()).await;
    assert!(agent_reason.contains("maintenance"), "{agent_reason}");
    for (tx, mut rx) in gateway_channels.into_iter().chain(agent_channels) {
        assert_eq!(within("a channel's end", rx.recv()).await, None);
        assert!(rx.close_reason().is_some_and(|r| !r.is_empty()), "the end has a reason");
        assert!(matches!(tx.send(Bytes::from_static(b"x")).await, Err(TunnelError::Closed(_))));
    }
    assert_eq!((pair.gateway.channels_open(), pair.agent.channels_open()), (0, 0));
    assert!(pair.gateway.is_closed() && pair.agent.is_closed());
    assert!(pair.incoming.next().await.is_none());
    let late = pair.gateway.open(&stdio("late"), WAIT).await.err();
    assert_eq!(late, Some(TunnelError::Closed("maintenance".to_owned())));
}

#[tokio::test]
async fn dropping_every_handle_ends_the_tunnel() {
    let pair = pair(settings()).await;
    let agent = pair.agent.clone();
    drop(pair.gateway);
    drop(pair._gateway_incoming);
    let reason = within("the agent's end", agent.closed()).await;
    assert!(reason.contains("handle"), "{reason}");
}

// ---- a raw peer that breaks the protocol ----

/// A gateway tunnel and the raw WebSocket of its "agent", with channel 1 open.
async fn raw_agent(settings: Settings) -> (TunnelHandle, Incoming, Channel, WebSocketStream<DuplexStream>) {
    let (server, mut raw) = sockets(&settings).await;
    let (gateway, incoming) = start(server, Side::Gateway, settings);
    let opening = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.open(&stdio("raw"), WAIT).await }
    });
    let open = raw_next(&mut raw).await;
    assert_eq!((open.kind, open.id), (frame::OPEN, 1));
    raw.send(Message::Binary(encode(frame::OPENED, 1, b""))).await.unwrap();
    let channel = within("open", opening).await.unwrap().unwrap();
    (gateway, incoming, channel, raw)
}

/// The next frame the raw peer receives (pings skipped).
async fn raw_next(raw: &mut WebSocketStream<DuplexStream>) -> frame::Frame {
    loop {
        match within("a frame", raw.next()).await {
            Some(Ok(Message::Binary(message))) => return frame::decode(message).unwrap(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("not a frame: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_peer_breaking_the_protocol_ends_the_tunnel() {
    let settings = settings();
    let window = settings.window;
    let data = |id: u32| Message::Binary(encode(frame::DATA, id, b"x"));
    let cases: Vec<(&str, Vec<Message>, &str)> = vec![
        ("sending past the window", (0..=window).map(|_| data(1)).collect(), "past its window"),
        ("a text message", vec![Message::text("hello")], "text message"),
        ("an unknown kind", vec![Message::Binary(encode(9, 1, b""))], "unknown frame kind 9"),
        ("Data on a channel never opened", vec![data(99)], "channel 99, which was never opened"),
        ("a frame shorter than its header", vec![Message::Binary(Bytes::from_static(&[4, 0, 0]))], "shorter"),
        ("channel 0", vec![Message::Binary(encode(frame::DATA, 0, b"x"))], "channel 0"),
        (
            "a frame over the limit",
            vec![Message::Binary(encode(frame::DATA, 1, &vec![0; settings.max_frame + 1]))],
            "too long",
        ),
        (
            "credit past the window",
            vec![Message::Binary(encode(frame::CREDIT, 1, &1u32.to_be_bytes()))],
            "Credit of 1 on channel 1 past its window",
        ),
        ("a malformed credit", vec![Message::Binary(encode(frame::CREDIT, 1, b"\x01"))], "not 4"),
        ("an Open from the agent", vec![Message::Binary(encode(frame::OPEN, 2, b"{}"))], "only the gateway opens"),
        ("a second Opened", vec![Message::Binary(encode(frame::OPENED, 1, b""))], "second Opened"),
        ("a Refused for an open channel", vec![Message::Binary(encode(frame::REFUSED, 1, b"no"))], "already open"),
    ];
    for (case, messages, expected) in cases {
        let (gateway, _incoming, channel, mut raw) = raw_agent(settings.clone()).await;
        let (tx, mut rx) = channel.split();
        for message in messages {
            raw.send(message).await.unwrap();
        }
        let reason = within(case, gateway.closed()).await;
        assert!(reason.contains(expected), "{case}: the reason {reason:?} does not say {expected:?}");
        // What arrived within the window may still be read; then the channel has ended.
        while within(case, rx.recv()).await.is_some() {}
        assert!(tx.send(Bytes::from_static(b"x")).await.is_err(), "{case}: sending after the end");
        assert_eq!(gateway.channels_open(), 0, "{case}");
    }
}

#[tokio::test]
async fn the_window_is_counted_not_just_buffered() {
    // The peer fills the window, the gateway reads a few (fewer than it grants back at once),
    // and the peer sends one more: the buffer has room, but the peer had no credit left.
    let (gateway, _incoming, channel, mut raw) = raw_agent(settings()).await;
    let (_tx, mut rx) = channel.split();
    for _ in 0..settings().window {
        raw.send(Message::Binary(encode(frame::DATA, 1, b"x"))).await.unwrap();
    }
    for _ in 0..3 {
        within("a message", rx.recv()).await.unwrap();
    }
    raw.send(Message::Binary(encode(frame::DATA, 1, b"one too many"))).await.unwrap();
    let reason = within("the end", gateway.closed()).await;
    assert!(reason.contains("past its window"), "{reason}");
}

#[tokio::test]
async fn frames_for_a_closed_channel_are_dropped_not_fatal() {
    let (gateway, _incoming, channel, mut raw) = raw_agent(settings()).await;
    let (_tx, mut rx) = channel.split();
    raw.send(Message::Binary(encode(frame::CLOSE, 1, b"done"))).await.unwrap();
    // The peer may send before it hears our Close: Data and Credit for a closed channel.
    raw.send(Message::Binary(encode(frame::DATA, 1, b"late"))).await.unwrap();
    raw.send(Message::Binary(encode(frame::CREDIT, 1, &1u32.to_be_bytes()))).await.unwrap();
    assert_eq!(within("the end", rx.recv()).await, None);
    assert_eq!(rx.close_reason().as_deref(), Some("done"));
    // The tunnel lives on: a second channel opens.
    let opening = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.open(&stdio("second"), WAIT).await.map(|c| c.id()) }
    });
    let open = raw_next(&mut raw).await;
    assert_eq!((open.kind, open.id), (frame::OPEN, 2));
    raw.send(Message::Binary(encode(frame::OPENED, 2, b""))).await.unwrap();
    assert_eq!(within("open", opening).await.unwrap(), Ok(2));
    assert!(!gateway.is_closed());
}

#[tokio::test]
async fn an_open_the_agent_cannot_read_is_refused_alone() {
    let settings = settings();
    let (mut raw, client) = sockets(&settings).await;
    let (agent, mut incoming) = start(client, Side::Agent, settings);
    raw.send(Message::Binary(encode(frame::OPEN, 1, br#"{"kind":"teleport"}"#))).await.unwrap();
    let refused = raw_next(&mut raw).await;
    assert_eq!((refused.kind, refused.id), (frame::REFUSED, 1));
    assert!(String::from_utf8_lossy(&refused.payload).contains("not understood"));
    // Ids only go up: reusing one is a protocol error.
    raw.send(Message::Binary(encode(frame::OPEN, 1, br#"{"kind":"teleport"}"#))).await.unwrap();
    let reason = within("the end", agent.closed()).await;
    assert!(reason.contains("not above channel 1"), "{reason}");
    assert!(incoming.next().await.is_none());
}

// ---- heartbeats ----

#[tokio::test]
async fn a_silent_peer_ends_the_tunnel() {
    let settings = Settings { heartbeat: Duration::from_millis(50), ..settings() };
    let (server, raw) = sockets(&settings).await;
    let (gateway, _incoming) = start(server, Side::Gateway, settings);
    // `raw` is never read, so it answers no ping.
    let reason = within("the heartbeat's verdict", gateway.closed()).await;
    assert!(reason.contains("heartbeat"), "{reason}");
    drop(raw);
}

#[tokio::test]
async fn heartbeats_keep_an_idle_tunnel_open() {
    let settings = Settings { heartbeat: Duration::from_millis(20), ..settings() };
    let pair = pair(settings).await;
    // Ten times the silence that would end it, with nothing but pings and pongs.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!pair.gateway.is_closed() && !pair.agent.is_closed());
}

// ---- metrics ----

/// A recorder that keeps each metric in an atomic, by name and labels.
#[derive(Default)]
struct Recorded(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Recorded {
    fn cell(&self, key: &metrics::Key) -> Arc<AtomicU64> {
        let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.0.lock().unwrap().entry(name).or_default())
    }

    fn value(&self, name: &str) -> Option<u64> {
        self.0.lock().unwrap().get(name).map(|cell| cell.load(Ordering::Relaxed))
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        self.value(name).map(f64::from_bits)
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[tokio::test]
async fn the_gateway_counts_bytes_and_open_channels() {
    let settings = settings();
    let (server, client) = sockets(&settings).await;
    let on_gateway = Recorded::default();
    let on_agent = Recorded::default();
    let (gateway, _gi) = metrics::with_local_recorder(&on_gateway, || start(server, Side::Gateway, settings.clone()));
    let (_agent, mut incoming) = metrics::with_local_recorder(&on_agent, || start(client, Side::Agent, settings));
    const OPEN: &str = "scopegate_executor_channels_open{}";
    const SENT: &str = "scopegate_executor_bytes_total{direction=sent}";
    const RECEIVED: &str = "scopegate_executor_bytes_total{direction=received}";

    let opening = tokio::spawn({
        let gateway = gateway.clone();
        async move { (gateway.open(&stdio("a"), WAIT).await.unwrap(), gateway.open(&stdio("b"), WAIT).await.unwrap()) }
    });
    let (agent_a_tx, _agent_a_rx) = accept_next(&mut incoming).await.split();
    let agent_b = accept_next(&mut incoming).await;
    let (a, b) = within("opens", opening).await.unwrap();
    assert_eq!(on_gateway.gauge(OPEN), Some(2.0));
    let (a_tx, mut a_rx) = a.split();
    a_tx.send(Bytes::from(vec![0; 1000])).await.unwrap();
    agent_a_tx.send(Bytes::from(vec![0; 2000])).await.unwrap();
    within("a message", a_rx.recv()).await.unwrap();
    drop(b);
    assert_eq!(on_gateway.gauge(OPEN), Some(1.0), "a dropped channel");
    let refused = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.open(&stdio("c"), WAIT).await.err() }
    });
    within("an open request", incoming.next()).await.unwrap().refuse("no");
    assert!(within("the refusal", refused).await.unwrap().is_some());
    assert_eq!(on_gateway.gauge(OPEN), Some(1.0), "a refused channel");
    gateway.close("done");
    assert_eq!(on_gateway.gauge(OPEN), Some(0.0), "the tunnel's end");
    assert!(on_gateway.value(SENT).is_some_and(|n| n > 1000), "sent: {:?}", on_gateway.value(SENT));
    assert!(on_gateway.value(RECEIVED).is_some_and(|n| n > 2000), "received: {:?}", on_gateway.value(RECEIVED));
    assert!(on_agent.0.lock().unwrap().is_empty(), "the agent records nothing");
    drop(agent_b);
}

// ---- the handshake over loopback HTTP ----

async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

fn client() -> reqwest::Client {
    crate::tls::install_provider();
    reqwest::Client::builder().build().unwrap()
}

/// The gateway's route: accepts the upgrade and hands the tunnel and the executor's name over.
fn gateway_router(tunnels: tokio::sync::mpsc::Sender<(TunnelHandle, String)>) -> axum::Router {
    let connect = move |mut request: axum::extract::Request| {
        let tunnels = tunnels.clone();
        async move {
            let settings = settings();
            let name = request.headers().get(EXECUTOR_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            match accept_upgrade(&mut request, &settings) {
                Err(reason) => http::Response::builder().status(400).body(axum::body::Body::from(reason)).unwrap(),
                Ok((response, upgrading)) => {
                    tokio::spawn(async move {
                        let ws = upgrading.ready().await.unwrap();
                        let (handle, _incoming) = start(ws, Side::Gateway, settings);
                        let _ = tunnels.send((handle, name)).await;
                    });
                    response
                }
            }
        }
    };
    axum::Router::new().route(CONNECT_PATH, axum::routing::get(connect))
}

#[tokio::test]
async fn an_agent_dials_and_the_gateway_accepts() {
    let (tunnels_tx, mut tunnels) = tokio::sync::mpsc::channel(1);
    let addr = serve(gateway_router(tunnels_tx)).await;
    let mut headers = http::HeaderMap::new();
    headers.insert(EXECUTOR_HEADER, http::HeaderValue::from_static("build-box"));
    // A trailing slash on the base is fine.
    let ws = dial(&client(), &format!("http://{addr}/"), headers, &settings()).await.unwrap();
    let (_agent, incoming) = start(ws, Side::Agent, settings());
    let agent = echo_agent(incoming);
    let (gateway, name) = within("the tunnel", tunnels.recv()).await.unwrap();
    assert_eq!(name, "build-box");
    let (tx, mut rx) = open(&gateway, "s").await.split();
    tx.send(Bytes::from_static(b"over http")).await.unwrap();
    assert_eq!(within("the echo", rx.recv()).await.as_deref(), Some(&b"over http"[..]));
    agent.abort();
}

#[tokio::test]
async fn a_gateway_that_answers_otherwise_is_refused_with_its_body() {
    let long = "y".repeat(5000);
    let router = axum::Router::new()
        .route(CONNECT_PATH, axum::routing::get(|| async { (http::StatusCode::UNAUTHORIZED, "bad secret") }))
        .route(
            "/long/executors/connect",
            axum::routing::get(move || async move { (http::StatusCode::CONFLICT, long) }),
        );
    let addr = serve(router).await;
    let error = dial(&client(), &format!("http://{addr}"), http::HeaderMap::new(), &settings()).await.err();
    assert!(matches!(&error, Some(DialError::Refused { status: 401, body }) if body == "bad secret"), "{error:?}");
    let error = dial(&client(), &format!("http://{addr}/long"), http::HeaderMap::new(), &settings()).await.err();
    assert!(
        matches!(&error, Some(DialError::Refused { status: 409, body }) if body.len() == 1024),
        "the body is capped: {error:?}"
    );
    let error = dial(&client(), "ftp://gateway", http::HeaderMap::new(), &settings()).await.err();
    assert!(matches!(&error, Some(DialError::Network(m)) if m.contains("not an http")), "{error:?}");
}

#[tokio::test]
async fn a_wrong_accept_key_is_no_websocket() {
    let router = axum::Router::new().route(
        CONNECT_PATH,
        axum::routing::get(|| async {
            http::Response::builder()
                .status(http::StatusCode::SWITCHING_PROTOCOLS)
                .header(http::header::UPGRADE, "websocket")
                .header(http::header::CONNECTION, "Upgrade")
                .header(http::header::SEC_WEBSOCKET_ACCEPT, "dGhlIHNhbXBsZSBub25jZQ==")
                .body(axum::body::Body::empty())
                .unwrap()
        }),
    );
    let addr = serve(router).await;
    let error = dial(&client(), &format!("http://{addr}"), http::HeaderMap::new(), &settings()).await.err();
    assert!(matches!(&error, Some(DialError::Network(m)) if m.contains("Sec-WebSocket-Accept")), "{error:?}");
}

#[tokio::test]
async fn a_request_that_is_no_upgrade_gets_a_reason() {
    let (tunnels_tx, _tunnels) = tokio::sync::mpsc::channel(1);
    let addr = serve(gateway_router(tunnels_tx)).await;
    let response = client().get(format!("http://{addr}{CONNECT_PATH}")).send().await.unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.text().await.unwrap().contains("Upgrade"));
}

#[test]
fn accept_upgrade_checks_each_part_of_the_request() {
    let valid = [
        ("upgrade", "WebSocket"),
        ("connection", "keep-alive, Upgrade"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let request = |method: &str, change: (&str, &str)| {
        let mut builder = http::Request::builder().method(method).uri(CONNECT_PATH);
        for (name, value) in valid {
            builder = builder.header(name, if name == change.0 { change.1 } else { value });
        }
        builder.body(axum::body::Body::empty()).unwrap()
    };
    let cases = [
        ("a POST", "POST", ("", ""), "not a POST"),
        ("no Upgrade", "GET", ("upgrade", "h2c"), "Upgrade header"),
        ("no Connection: upgrade", "GET", ("connection", "close"), "Connection"),
        ("version 8", "GET", ("sec-websocket-version", "8"), "not 13"),
        ("a short key", "GET", ("sec-websocket-key", "c2hvcnQ="), "16 bytes"),
        // Valid, but built by hand: no connection behind it to hand over.
        ("no connection to upgrade", "GET", ("", ""), "cannot be upgraded"),
    ];
    for (case, method, change, expected) in cases {
        let error = accept_upgrade(&mut request(method, change), &settings()).err().unwrap_or_default();
        assert!(error.contains(expected), "{case}: {error:?}");
    }
}

// ---- a figure, not a test ----

/// Round trips of one small message over one channel on a loopback TCP tunnel, against the same
/// over bare TCP. Run: `cargo test --release --lib tunnel:: -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn round_trip_figure() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const ROUNDS: usize = 20_000;
    let message = Bytes::from(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}"#);
    let p50 = |mut samples: Vec<Duration>| {
        samples.sort();
        (samples[samples.len() / 2], samples[samples.len() * 99 / 100])
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepting = tokio::spawn(async move { listener.accept().await.unwrap().0 });
    let dialed = tokio::net::TcpStream::connect(addr).await.unwrap();
    let accepted = accepting.await.unwrap();
    dialed.set_nodelay(true).unwrap();
    accepted.set_nodelay(true).unwrap();
    let settings = Settings::default();
    let server = WebSocketStream::from_raw_socket(accepted, Role::Server, Some(ws_config(&settings))).await;
    let client = WebSocketStream::from_raw_socket(dialed, Role::Client, Some(ws_config(&settings))).await;
    let (gateway, _gi) = start(server, Side::Gateway, settings.clone());
    let (_agent, incoming) = start(client, Side::Agent, settings);
    let agent = echo_agent(incoming);
    let (tx, mut rx) = gateway.open(&stdio("bench"), WAIT).await.unwrap().split();
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        tx.send(message.clone()).await.unwrap();
        rx.recv().await.unwrap();
        samples.push(t.elapsed());
    }
    let (tunnel_p50, tunnel_p99) = p50(samples);
    agent.abort();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let len = message.len();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.set_nodelay(true).unwrap();
        let mut buf = vec![0; len];
        while socket.read_exact(&mut buf).await.is_ok() {
            if socket.write_all(&buf).await.is_err() {
                break;
            }
        }
    });
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let mut buf = vec![0; len];
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        socket.write_all(&message).await.unwrap();
        socket.read_exact(&mut buf).await.unwrap();
        samples.push(t.elapsed());
    }
    let (tcp_p50, tcp_p99) = p50(samples);
    println!(
        "{ROUNDS} round trips of {len} bytes: tunnel p50 {tunnel_p50:?} p99 {tunnel_p99:?}; bare TCP p50 {tcp_p50:?} p99 {tcp_p99:?}"
    );
}

#[test]
fn a_refusal_class_travels_in_front_of_its_reason() {
    for class in Refusal::ALL {
        let tagged = class.tag("p: why");
        assert_eq!(Refusal::split(&tagged), (Some(class), "p: why"), "{tagged}");
    }
    assert_eq!(Refusal::tag(Refusal::NotFound, "x"), "[not_found] x");
    // No class, an unknown one, or one without its space: the whole reason, unclassified.
    for reason in ["", "no such file", "[unknown] x", "[not_found]x", "not_found: x", "[not_found"] {
        assert_eq!(Refusal::split(reason), (None, reason), "{reason}");
    }
}
