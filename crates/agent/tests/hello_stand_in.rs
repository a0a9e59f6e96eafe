//! The switch agent's HELLO stand-in (issue 18), on loopback: while the
//! controller agent is down, OVS's new OpenFlow connection gets the
//! controller's previous HELLO at once; when the controller agent is back, the
//! controller receives OVS's HELLO as usual and its own HELLO is swallowed, so
//! OVS's next message is the FEATURES_REQUEST. A controller whose new HELLO
//! would negotiate another version gets the session closed, with a log line,
//! and its old HELLO forgotten. With 0-RTT the stand-in also answers on the
//! live link to the restarted controller agent; once the controller agent is
//! known dead (an attempt got no answer) OVS gets no stand-in.

mod support;

use quicsdn_agent::config::SwitchConfig;
use quicsdn_agent::{ControllerAgent, SwitchAgent};
use quicsdn_wire::openflow::message;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A HELLO with a version bitmap (OpenFlow 1.3.5 §7.5.1).
fn hello(version: u8, bitmap: u32, xid: u32) -> Vec<u8> {
    let mut e = vec![0, 1, 0, 8];
    e.extend_from_slice(&bitmap.to_be_bytes());
    message(version, 0, xid, &e)
}

async fn read_exactly(s: &mut (impl AsyncRead + Unpin), n: usize, within: Duration) -> Vec<u8> {
    let mut buf = vec![0; n];
    tokio::time::timeout(within, s.read_exact(&mut buf))
        .await
        .expect("timed out reading")
        .expect("read");
    buf
}

/// OVS's new connection while the controller agent is down: the switch agent
/// answers with `expect` within OVS's 1 s HELLO wait; OVS sends its HELLO.
async fn ovs_reconnects(agent: &SwitchAgent, expect: &[u8], ovs_hello: &[u8]) -> TcpStream {
    let mut ovs = ovs_connect(agent, "openflow").await;
    ovs.write_all(ovs_hello).await.unwrap();
    let got = read_exactly(&mut ovs, expect.len(), Duration::from_secs(1)).await;
    assert_eq!(got, expect, "the controller's previous HELLO, at once");
    ovs
}

/// A controller agent and a switch agent `sw1` whose OpenFlow service goes
/// from a `ptcp:` listener (OVS's side) to a fake controller.
struct Bed {
    pki: Pki,
    fake: FakeController,
    services: [String; 1],
    controller: ControllerAgent,
    agent: SwitchAgent,
}

impl Bed {
    async fn up(tweak: impl FnOnce(&mut SwitchConfig)) -> Bed {
        let pki = Pki::new();
        let fake = FakeController::new().await;
        let services = [format!("openflow={}", fake.target())];
        let (controller, agent) = pair(
            &pki,
            "sw1",
            &services,
            &["openflow=ptcp:0:127.0.0.1".to_string()],
            |_, s| tweak(s),
        )
        .await;
        Bed {
            pki,
            fake,
            services,
            controller,
            agent,
        }
    }
}

/// OVS's first session: both HELLOs cross as usual, and the switch agent
/// remembers the controller's.
async fn first_session(
    agent: &SwitchAgent,
    fake: &FakeController,
    ovs_hello: &[u8],
    ctl_hello: &[u8],
) -> TcpStream {
    let mut ovs = ovs_connect(agent, "openflow").await;
    ovs.write_all(ovs_hello).await.unwrap();
    let mut ctl = fake.accept().await;
    assert_eq!(read_exactly(&mut ctl, 16, PATIENCE).await, ovs_hello);
    ctl.write_all(ctl_hello).await.unwrap();
    assert_eq!(read_exactly(&mut ovs, 16, PATIENCE).await, ctl_hello);
    ovs
}

/// OVS's HELLO: OpenFlow 1.3, in the header and the bitmap.
fn ovs_hello() -> Vec<u8> {
    hello(4, 1 << 4, 1)
}

/// os-ken's HELLO: 1.5 in the header, 1.0 to 1.5 in the bitmap.
fn ctl_hello() -> Vec<u8> {
    hello(6, 0b111_1110, 9)
}

/// The setup every restart test starts from: OVS's first session (both
/// HELLOs cross, the switch agent remembers the controller's), then the
/// controller agent stops and the switch agent closes OVS's connection.
async fn first_session_then_controller_stops(
    agent: &SwitchAgent,
    fake: &FakeController,
    controller: ControllerAgent,
) {
    let mut ovs = first_session(agent, fake, &ovs_hello(), &ctl_hello()).await;
    controller.shutdown().await;
    assert_closed(&mut ovs).await;
}

/// OVS's connection is closed by the switch agent.
async fn assert_closed(ovs: &mut TcpStream) {
    let mut eof = [0u8; 1];
    let n = tokio::time::timeout(PATIENCE, ovs.read(&mut eof)).await;
    assert!(
        matches!(n, Ok(Ok(0) | Err(_))),
        "OVS's connection closed: {n:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn ovs_gets_the_controllers_hello_while_the_controller_agent_restarts() {
    let (logs, _guard) = LogCapture::install();
    let Bed {
        pki,
        fake,
        services,
        controller,
        agent,
    } = Bed::up(|s| s.common.quic.zero_rtt = false).await;
    let addr = controller.local_addr().unwrap();
    let (ovs_hello, ctl_hello) = (ovs_hello(), ctl_hello());
    let features_request = message(4, 5, 10, &[]);

    // The controller agent goes away; OVS reconnects while it is down.
    first_session_then_controller_stops(&agent, &fake, controller).await;
    let mut ovs = ovs_reconnects(&agent, &ctl_hello, &ovs_hello).await;

    // Back: the controller gets OVS's HELLO; its own HELLO is swallowed.
    let controller = controller_agent_at(&pki, &services, addr).await;
    let mut ctl = fake.accept().await;
    assert_eq!(read_exactly(&mut ctl, 16, PATIENCE).await, ovs_hello);
    ctl.write_all(&[ctl_hello.clone(), features_request.clone()].concat())
        .await
        .unwrap();
    assert_eq!(
        read_exactly(&mut ovs, 8, PATIENCE).await,
        features_request,
        "OVS sees one HELLO only"
    );
    // And the session carries on both ways.
    let reply = message(4, 6, 10, &[0; 24]);
    ovs.write_all(&reply).await.unwrap();
    assert_eq!(read_exactly(&mut ctl, reply.len(), PATIENCE).await, reply);

    // Again, but now the controller offers OpenFlow 1.0 only: OVS negotiated
    // 1.3 with the stand-in, so the session must close.
    controller.shutdown().await;
    assert_closed(&mut ovs).await;
    let mut ovs = ovs_reconnects(&agent, &ctl_hello, &ovs_hello).await;
    let controller = controller_agent_at(&pki, &services, addr).await;
    let mut ctl = fake.accept().await;
    assert_eq!(read_exactly(&mut ctl, 16, PATIENCE).await, ovs_hello);
    ctl.write_all(&hello(1, 1 << 1, 11)).await.unwrap();
    // Closed instead of receiving a second HELLO.
    assert_closed(&mut ovs).await;
    let lines = logs.lines_with(&["session closed", "negotiates OpenFlow version 0x01"]);
    assert_eq!(lines.len(), 1, "{}", logs.text());
    assert!(lines[0].contains("negotiated 0x04"), "{}", lines[0]);

    // The old HELLO is forgotten: OVS's next connection waits for the
    // controller's own HELLO, which is remembered from then on.
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&ovs_hello).await.unwrap();
    let mut ctl = fake.accept().await;
    assert_eq!(read_exactly(&mut ctl, 16, PATIENCE).await, ovs_hello);
    let ctl_hello_10 = hello(1, 1 << 1, 12);
    ctl.write_all(&ctl_hello_10).await.unwrap();
    assert_eq!(
        read_exactly(&mut ovs, 16, PATIENCE).await,
        ctl_hello_10,
        "the controller's new HELLO, not the forgotten one"
    );

    agent.shutdown().await;
    controller.shutdown().await;
}

/// OVS probes its controller after 5 s of silence and drops the connection 5 s
/// later without an answer. After a stand-in HELLO the switch agent answers
/// OVS's ECHO_REQUESTs itself until the controller speaks: while it waits for
/// the controller agent, and on the session before the controller's HELLO.
/// The requests still reach the controller; once it has spoken, it alone
/// answers.
#[tokio::test(flavor = "current_thread")]
async fn ovs_echo_is_answered_until_the_controller_speaks() {
    let Bed {
        pki,
        fake,
        services,
        controller,
        agent,
    } = Bed::up(|s| s.common.quic.zero_rtt = false).await;
    let addr = controller.local_addr().unwrap();
    let (ovs_hello, ctl_hello) = (ovs_hello(), ctl_hello());
    let echo = |t: u8, xid: u32, data: &[u8]| message(4, t, xid, data);
    first_session_then_controller_stops(&agent, &fake, controller).await;

    // The controller agent is down: the switch agent waits for it.
    let mut ovs = ovs_reconnects(&agent, &ctl_hello, &ovs_hello).await;
    let probe_a = echo(2, 20, b"probe-a");
    ovs.write_all(&probe_a).await.unwrap();
    assert_eq!(
        read_exactly(&mut ovs, probe_a.len(), Duration::from_secs(1)).await,
        echo(3, 20, b"probe-a"),
        "answered while no controller agent runs"
    );

    // Back, and the session is open, but the controller has not spoken.
    let controller = controller_agent_at(&pki, &services, addr).await;
    let mut ctl = fake.accept().await;
    let so_far = [ovs_hello.clone(), probe_a.clone()].concat();
    assert_eq!(
        read_exactly(&mut ctl, so_far.len(), PATIENCE).await,
        so_far,
        "OVS's HELLO and its echo request reach the controller"
    );
    let probe_b = echo(2, 21, b"probe-b!");
    ovs.write_all(&probe_b).await.unwrap();
    assert_eq!(
        read_exactly(&mut ovs, probe_b.len(), Duration::from_secs(1)).await,
        echo(3, 21, b"probe-b!"),
        "answered on the session before the controller's HELLO"
    );
    assert_eq!(
        read_exactly(&mut ctl, probe_b.len(), PATIENCE).await,
        probe_b
    );

    // The controller speaks: from now on its answers are the only ones.
    let features_request = message(4, 5, 10, &[]);
    ctl.write_all(&[ctl_hello.clone(), features_request.clone()].concat())
        .await
        .unwrap();
    assert_eq!(read_exactly(&mut ovs, 8, PATIENCE).await, features_request);
    let probe_c = echo(2, 22, b"c");
    ovs.write_all(&probe_c).await.unwrap();
    assert_eq!(
        read_exactly(&mut ctl, probe_c.len(), PATIENCE).await,
        probe_c
    );
    let barrier = message(4, 20, 23, &[]);
    ctl.write_all(&[echo(3, 22, b"c"), barrier.clone()].concat())
        .await
        .unwrap();
    let want = [echo(3, 22, b"c"), barrier].concat();
    assert_eq!(
        read_exactly(&mut ovs, want.len(), PATIENCE).await,
        want,
        "one echo reply, the controller's, then the controller's next message"
    );
    agent.shutdown().await;
    controller.shutdown().await;
}

/// With 0-RTT (the default), the switch agent is connected to the restarted
/// controller agent at once; OVS's HELLO wait must not depend on how soon the
/// controller behind it answers, so OVS gets the stand-in on a live link too.
#[tokio::test(flavor = "current_thread")]
async fn with_0rtt_ovs_gets_the_hello_before_the_restarted_controller_answers() {
    let Bed {
        pki,
        fake,
        services,
        controller,
        agent,
    } = Bed::up(|_| {}).await;
    let addr = controller.local_addr().unwrap();
    let (ovs_hello, ctl_hello) = (ovs_hello(), ctl_hello());

    // The controller agent restarts, and the switch agent is back on it.
    first_session_then_controller_stops(&agent, &fake, controller).await;
    let controller = controller_agent_at(&pki, &services, addr).await;
    assert!(agent.wait_connected(PATIENCE).await, "never reconnected");

    // OVS reconnects: the HELLO comes at once, before the controller has even
    // accepted the controller agent's connection.
    let mut ovs = ovs_reconnects(&agent, &ctl_hello, &ovs_hello).await;
    let mut ctl = fake.accept().await;
    assert_eq!(read_exactly(&mut ctl, 16, PATIENCE).await, ovs_hello);
    let features_request = message(4, 5, 10, &[]);
    ctl.write_all(&[ctl_hello.clone(), features_request.clone()].concat())
        .await
        .unwrap();
    assert_eq!(
        read_exactly(&mut ovs, 8, PATIENCE).await,
        features_request,
        "OVS sees one HELLO only"
    );
    agent.shutdown().await;
    controller.shutdown().await;
}

/// A controller agent that does not come back: OVS's fail mode must see it.
/// After the graceful close, OVS's next connection still gets the stand-in
/// (a restart is likely) and is closed when the attempt gets no answer; from
/// then on the link is known dead, and OVS gets nothing but a close.
#[tokio::test(flavor = "current_thread")]
async fn once_the_controller_agent_is_known_dead_ovs_gets_no_stand_in() {
    let grace = Duration::from_secs(2);
    let Bed {
        fake,
        controller,
        agent,
        ..
    } = Bed::up(|s| {
        s.common.quic.idle_timeout = grace;
        s.common.quic.keepalive = quicsdn_transport::quic::agent_keepalive_for(grace);
    })
    .await;
    let (ovs_hello, ctl_hello) = (ovs_hello(), ctl_hello());
    first_session_then_controller_stops(&agent, &fake, controller).await;
    // Just after the close: the stand-in, then a close once the attempt
    // (0-RTT, to nobody) gives up within the grace period.
    let mut ovs = ovs_reconnects(&agent, &ctl_hello, &ovs_hello).await;
    assert_closed(&mut ovs).await;
    // Known dead: no HELLO, only a close, so OVS's fail mode takes over.
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&ovs_hello).await.unwrap();
    let mut got = Vec::new();
    let n = tokio::time::timeout(PATIENCE, ovs.read_to_end(&mut got)).await;
    assert!(
        matches!(n, Ok(Ok(0)) | Ok(Err(_))) && got.is_empty(),
        "nothing but a close reaches OVS: {n:?} {got:?}"
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn without_the_stand_in_ovs_waits_for_the_controller() {
    let Bed {
        fake,
        controller,
        agent,
        ..
    } = Bed::up(|s| {
        s.common.quic.zero_rtt = false;
        s.hello_stand_in = false;
    })
    .await;
    first_session_then_controller_stops(&agent, &fake, controller).await;
    let mut ovs = ovs_connect(&agent, "openflow").await;
    ovs.write_all(&ovs_hello()).await.unwrap();
    let mut b = [0u8; 1];
    let got = tokio::time::timeout(Duration::from_secs(1), ovs.read(&mut b)).await;
    assert!(
        !matches!(got, Ok(Ok(n)) if n > 0),
        "nothing but a close reaches OVS: {got:?}"
    );
    agent.shutdown().await;
}
