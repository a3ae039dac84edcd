//! One client connection: the peer check, reading requests in either wire format, and
//! writing the answers back as they finish.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{Mutex, mpsc};

use super::dispatch::dispatch;
use super::wire::{FrameRequest, FrameResponse, MAX_REQUEST_BYTES, Op};
use super::{DaemonConfig, Shared};
use crate::cancel::CancelSignal;

fn peer_allowed(config: &DaemonConfig, uid: u32, gid: u32) -> bool {
    uid == nix::unistd::geteuid().as_raw()
        || config.allow_uids.contains(&uid)
        || config.allow_gids.contains(&gid)
}

pub(super) async fn serve_connection(shared: Arc<Shared>, stream: UnixStream) {
    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
    let (mut reader, mut writer) = stream.into_split();
    let cred = reader.as_ref().peer_cred();
    let allowed = cred
        .as_ref()
        .is_ok_and(|c| peer_allowed(&shared.config, c.uid(), c.gid()));
    if !allowed {
        shared.stats.refused_peers.fetch_add(1, Ordering::Relaxed);
        let who = cred
            .map(|c| format!("uid {} gid {}", c.uid(), c.gid()))
            .unwrap_or_else(|e| format!("unknown peer ({e})"));
        tracing::warn!(peer = %who, "refused a daemon client");
        let line = format!(
            "{}\n",
            json!({"id": null, "error": {"kind": "forbidden", "message": format!("peer {who} is not allowed")}})
        );
        let _ = writer.write_all(line.as_bytes()).await;
        return;
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let write_task = tokio::spawn(async move {
        while let Some(bytes) = out_rx.recv().await {
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    // In-flight requests of this connection, by id, for cancel and disconnect.
    let in_flight: Arc<Mutex<HashMap<String, CancelSignal>>> = Arc::new(Mutex::new(HashMap::new()));

    let mut first = [0u8; 1];
    let framed = match reader.read(&mut first).await {
        Ok(1) => !(first[0] == b'{' || first[0].is_ascii_whitespace()),
        _ => {
            write_task.abort();
            return;
        }
    };
    let mut buffer: Vec<u8> = first.to_vec();
    if framed {
        serve_frames(&shared, &mut reader, buffer, &out_tx, &in_flight).await;
    } else {
        let mut chunk = [0u8; 64 * 1024];
        let mut oversized = false;
        loop {
            while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=pos).collect();
                if oversized {
                    oversized = false;
                    continue;
                }
                handle_json_line(&shared, &line, &out_tx, &in_flight).await;
            }
            if buffer.len() > MAX_REQUEST_BYTES {
                // Answer once, then discard the rest of this line.
                let _ = out_tx.send(format!("{}\n", json!({"id": null, "error": {"kind": "invalid_request", "message": format!("request larger than {MAX_REQUEST_BYTES} bytes")}})).into_bytes()).await;
                buffer.clear();
                oversized = true;
            }
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }
    // The client is gone: cancel everything it still had running.
    for (_, signal) in in_flight.lock().await.drain() {
        signal.cancel();
    }
    drop(out_tx);
    let _ = write_task.await;
}

async fn serve_frames(
    shared: &Arc<Shared>,
    reader: &mut tokio::net::unix::OwnedReadHalf,
    mut pending: Vec<u8>,
    out: &mpsc::Sender<Vec<u8>>,
    in_flight: &Arc<Mutex<HashMap<String, CancelSignal>>>,
) {
    let mut decoder = airlock_protocol::FrameDecoder::with_max_frame_bytes(MAX_REQUEST_BYTES);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let mut input: &[u8] = &pending;
        let mut requests = Vec::new();
        let mut broken = false;
        while !input.is_empty() {
            match decoder.decode_message::<FrameRequest>(&mut input) {
                Ok(Some(request)) => requests.push(request),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "malformed frame from a daemon client");
                    broken = true;
                    break;
                }
            }
        }
        pending.clear();
        for request in requests {
            let id = Value::from(request.id);
            let op = serde_json::from_str::<Op>(&request.op_json);
            let out = out.clone();
            let reply: Box<dyn Fn(Value) -> Vec<u8> + Send + Sync> =
                Box::new(move |body: Value| {
                    let response = FrameResponse {
                        id: request.id,
                        body_json: body.to_string(),
                    };
                    airlock_protocol::frame::encode_frame(&response).unwrap_or_default()
                });
            dispatch(
                shared,
                id,
                op.map_err(|e| e.to_string()),
                out,
                reply,
                in_flight,
            )
            .await;
        }
        if broken {
            return;
        }
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    }
}

async fn handle_json_line(
    shared: &Arc<Shared>,
    line: &[u8],
    out: &mpsc::Sender<Vec<u8>>,
    in_flight: &Arc<Mutex<HashMap<String, CancelSignal>>>,
) {
    let text = String::from_utf8_lossy(line);
    if text.trim().is_empty() {
        return;
    }
    let parsed: Result<Value, _> = serde_json::from_str(&text);
    let (id, op) = match parsed {
        Ok(value) => {
            let id = value.get("id").cloned().unwrap_or(Value::Null);
            (
                id,
                serde_json::from_value::<Op>(value).map_err(|e| e.to_string()),
            )
        }
        Err(e) => (
            Value::Null,
            Err(format!(
                "not JSON: line {}, column {}",
                e.line(),
                e.column()
            )),
        ),
    };
    let reply_id = id.clone();
    let reply: Box<dyn Fn(Value) -> Vec<u8> + Send + Sync> = Box::new(move |mut body: Value| {
        if let Value::Object(map) = &mut body {
            map.insert("id".into(), reply_id.clone());
        }
        format!("{body}\n").into_bytes()
    });
    dispatch(shared, id, op, out.clone(), reply, in_flight).await;
}
