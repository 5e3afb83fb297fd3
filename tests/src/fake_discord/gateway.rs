//! The fake Gateway WebSocket server.

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::{GatewayOp, Session, Shared, ToClient, APPLICATION_ID, BOT_ID, BOT_NAME};

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        tokio::spawn(connection(stream, shared.clone(), stop.clone()));
    }
}

async fn connection(stream: tokio::net::TcpStream, shared: Arc<Shared>, stop: CancellationToken) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
    let interval = {
        let mut state = shared.lock();
        state.connections += 1;
        state.heartbeat_interval
    };
    shared.changed();
    let hello = json!({ "op": 10, "d": { "heartbeat_interval": interval.as_millis() as u64 }, "s": null, "t": null });
    if ws.send(Message::text(hello.to_string())).await.is_err() {
        return;
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<ToClient>();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            command = rx.recv() => match command {
                Some(ToClient::Payload(payload)) => {
                    if ws.send(Message::text(payload.to_string())).await.is_err() {
                        break;
                    }
                }
                Some(ToClient::Close(code)) => {
                    let frame = CloseFrame { code: CloseCode::from(code), reason: "".into() };
                    let _ = ws.close(Some(frame)).await;
                    break;
                }
                Some(ToClient::Drop) | None => break,
            },
            frame = ws.next() => {
                let text = match frame {
                    Some(Ok(Message::Text(text))) => text.to_string(),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                let Ok(payload) = serde_json::from_str::<Value>(&text) else { break };
                if !on_payload(&shared, &payload, &tx, &mut ws).await {
                    break;
                }
            }
        }
    }
    let mut state = shared.lock();
    if state.connection.as_ref().is_some_and(|(_, current)| current.same_channel(&tx)) {
        state.connection = None;
    }
    drop(state);
    shared.changed();
}

/// Handles one payload from the client; false when the connection is to end.
async fn on_payload<S>(
    shared: &Arc<Shared>,
    payload: &Value,
    tx: &mpsc::UnboundedSender<ToClient>,
    ws: &mut S,
) -> bool
where
    S: futures::Sink<Message> + Unpin,
{
    let op = payload["op"].as_u64().unwrap_or(u64::MAX);
    let d = &payload["d"];
    // What to send back once the lock is released.
    let reply: Option<Message> = match op {
        2 => {
            let mut state = shared.lock();
            let intents = d["intents"].as_u64().unwrap_or(0);
            state.ops.push(GatewayOp::Identify { intents });
            if d["token"].as_str() == Some(state.token.as_str()) {
                let session_id = format!("session-{}", state.next_id());
                state.sessions.insert(session_id.clone(), Session::default());
                state.current_session = Some(session_id.clone());
                state.connection = Some((session_id.clone(), tx.clone()));
                let ready = json!({
                    "v": 10,
                    "user": { "id": BOT_ID.to_string(), "username": BOT_NAME, "discriminator": "0", "bot": true },
                    "guilds": [],
                    "session_id": session_id,
                    "resume_gateway_url": state.gateway_url,
                    "application": { "id": APPLICATION_ID.to_string(), "flags": 0 },
                });
                state.dispatch("READY", ready);
                None
            } else {
                let frame = CloseFrame {
                    code: CloseCode::from(4004),
                    reason: "Authentication failed.".into(),
                };
                Some(Message::Close(Some(frame)))
            }
        }
        6 => {
            let mut state = shared.lock();
            let session_id = d["session_id"].as_str().unwrap_or_default().to_owned();
            let seq = d["seq"].as_u64().unwrap_or(0);
            state.ops.push(GatewayOp::Resume { session_id: session_id.clone(), seq });
            let known = state.sessions.contains_key(&session_id)
                && d["token"].as_str() == Some(state.token.as_str());
            if state.refuse_resume || !known {
                state.refuse_resume = false;
                Some(Message::text(
                    json!({ "op": 9, "d": false, "s": null, "t": null }).to_string(),
                ))
            } else {
                state.current_session = Some(session_id.clone());
                state.connection = Some((session_id.clone(), tx.clone()));
                let missed: Vec<Value> = state.sessions[&session_id]
                    .log
                    .iter()
                    .filter(|(s, _)| *s > seq)
                    .map(|(_, payload)| payload.clone())
                    .collect();
                for payload in missed {
                    let _ = tx.send(ToClient::Payload(payload));
                }
                state.dispatch("RESUMED", json!({}));
                None
            }
        }
        1 => {
            let mut state = shared.lock();
            state.ops.push(GatewayOp::Heartbeat { seq: d.as_u64() });
            state.ack_heartbeats.then(|| {
                Message::text(json!({ "op": 11, "d": null, "s": null, "t": null }).to_string())
            })
        }
        _ => None,
    };
    shared.changed();
    match reply {
        Some(close @ Message::Close(_)) => {
            let _ = ws.send(close).await;
            false
        }
        Some(reply) => ws.send(reply).await.is_ok(),
        None => true,
    }
}
