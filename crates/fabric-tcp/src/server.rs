//! The owner side: a listener thread, and one responder thread per accepted
//! connection that reads frames, executes operations on local regions and
//! answers. This is where the owner's CPU is spent on every remote operation.

use crate::client::frame_name;
use crate::secure::{self, FrameReader, SealState};
use crate::{lock, Shared};
use std::io::BufReader;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use tierstack_base::limits::TRANSFER_BYTES_MAX;
use tierstack_base::NodeId;
use tierstack_fabric::{check_batch, execute_on_memory, Channel, FabricError, Message, Op};
use tierstack_fabric_wire::{decode, encode, Frame};

/// Pause after a failed `accept` (out of descriptors, for example), so the
/// listener does not spin while the condition lasts.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// The listener thread: accepts until the fabric closes.
pub(crate) fn run_listener(shared: Arc<Shared>, listener: TcpListener) {
    for accepted in listener.incoming() {
        if shared.is_closed() {
            break;
        }
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(node = %shared.node, error = %e, "accept failed");
                std::thread::sleep(ACCEPT_ERROR_BACKOFF);
                continue;
            }
        };
        if let Err(e) = admit(&shared, stream) {
            tracing::warn!(node = %shared.node, error = %e, "refusing a connection");
        }
    }
    tracing::debug!(node = %shared.node, "listener stopped");
}

fn admit(shared: &Arc<Shared>, stream: TcpStream) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    stream.set_nodelay(true).map_err(io)?;
    // A client that stops reading its answers must not pin the responder.
    stream.set_write_timeout(Some(shared.op_timeout)).map_err(io)?;
    let control = stream.try_clone().map_err(io)?;
    let id = shared.next_id();
    {
        let mut accepted = lock(&shared.accepted);
        if accepted.len() >= crate::ACCEPTED_CONNECTIONS_MAX {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(format!("already serving {} connections", crate::ACCEPTED_CONNECTIONS_MAX));
        }
        accepted.insert(id, control);
    }
    admit_handshake(shared, id, &stream);
    let thread_shared = Arc::clone(shared);
    let spawned = shared.spawn(format!("tcp-{}-resp{id}", shared.node.0), move || {
        run_responder(&thread_shared, id, stream);
        lock(&thread_shared.accepted).remove(&id);
        lock(&thread_shared.handshaking).remove(&id);
    });
    if let Err(e) = spawned {
        if let Some(control) = lock(&shared.accepted).remove(&id) {
            let _ = control.shutdown(Shutdown::Both);
        }
        return Err(e.to_string());
    }
    Ok(())
}

/// Counts `stream` among the connections still handshaking; over
/// [`secure::HANDSHAKES_MAX`], closes the oldest of them (ids grow with
/// time), so idle or slow connections can never hold every slot.
fn admit_handshake(shared: &Shared, id: u64, stream: &TcpStream) {
    let Ok(control) = stream.try_clone() else { return };
    let mut handshaking = lock(&shared.handshaking);
    handshaking.insert(id, control);
    while handshaking.len() > secure::HANDSHAKES_MAX {
        if let Some((oldest, stream)) = handshaking.pop_first() {
            tracing::warn!(node = %shared.node, connection = oldest, "too many connections handshaking; closing the oldest");
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Serves one connection until it ends or misbehaves. Errors are the
/// connection's alone: they are logged and the connection is closed.
fn run_responder(shared: &Shared, id: u64, mut stream: TcpStream) {
    let peer_addr = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".to_string());
    let accepted = secure::accept(shared, &mut stream);
    lock(&shared.handshaking).remove(&id);
    let secure::Accepted { peer: from, wired } = match accepted {
        Ok(Some(accepted)) => accepted,
        Ok(None) => return,
        Err(reason) => {
            if !shared.is_closed() {
                tracing::warn!(node = %shared.node, peer = %peer_addr, %reason, "refusing a connection");
            }
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let secure::Wired { control, reader, mut writer, sealer, opener } = wired;
    let mut sealer: SealState = sealer;
    let mut frames = FrameReader::new(BufReader::with_capacity(crate::READ_BUFFER_BYTES, reader), opener);
    loop {
        let frame = match frames.next_body().and_then(|body| body.map(decode).transpose()) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                if !shared.is_closed() {
                    tracing::warn!(node = %shared.node, peer = %from, error = %e, "bad frame; closing the connection");
                }
                break;
            }
        };
        let answer = match frame {
            Frame::Message { channel, payload } => {
                if deliver(shared, from, channel, payload) {
                    continue;
                }
                break;
            }
            Frame::Lookup { request, name } => answer_lookup(shared, request, &name),
            Frame::Ops { request, region, incarnation, ops } => {
                answer_ops(shared, from, request, region, incarnation, &ops)
            }
            other => {
                tracing::warn!(node = %shared.node, peer = %from, frame = frame_name(&other), "unexpected frame; closing the connection");
                break;
            }
        };
        if let Err(e) = secure::write_frame_bytes(&mut writer, &mut sealer, encode(&answer)) {
            tracing::debug!(node = %shared.node, peer = %from, error = %e, "cannot answer; closing the connection");
            break;
        }
    }
    let _ = control.shutdown(Shutdown::Both);
}

/// Delivers a message to its channel's inbox, waiting while that inbox is
/// full: this connection is not read meanwhile, so the sender's writes wait
/// (TCP flow control) and its `send` either finishes once there is room or
/// fails with `Timeout`. No message is dropped. A conforming sender uses one
/// connection per channel, so only that channel is held back. False when
/// the connection must end (an oversized message, which no conforming sender
/// sends, or shutdown).
fn deliver(shared: &Shared, from: NodeId, channel: Channel, payload: Vec<u8>) -> bool {
    if payload.len() > TRANSFER_BYTES_MAX {
        tracing::warn!(node = %shared.node, peer = %from, bytes = payload.len(), "an oversized message; closing");
        return false;
    }
    let mut message = Message { from, channel, payload };
    loop {
        match shared.inboxes.deliver_timeout(message, crate::INBOX_WAIT_SLICE) {
            Ok(None) => return true,
            // Still full: wait on, unless the node is closing.
            Ok(Some(undelivered)) if !shared.is_closed() => message = undelivered,
            Ok(Some(_)) | Err(_) => return false,
        }
    }
}

fn answer_lookup(shared: &Shared, request: u64, name: &str) -> Frame {
    let regions = shared.regions.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    match regions.by_name.get(name) {
        Some(&region) => match regions.by_index.get(region as usize) {
            Some(registered) => {
                Frame::LookupOk { request, region, incarnation: registered.incarnation, len: registered.region.len() }
            }
            None => Frame::Error { request, error: unknown_region(shared.node, name) },
        },
        None => Frame::Error { request, error: unknown_region(shared.node, name) },
    }
}

/// Executes a batch `from` posted, if its rights on the region allow every
/// op of it (checked before anything executes, as bounds are).
fn answer_ops(shared: &Shared, from: NodeId, request: u64, region: u32, incarnation: u64, ops: &[Op]) -> Frame {
    let local = {
        let regions = shared.regions.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        regions.by_index.get(region as usize).filter(|r| r.incarnation == incarnation).map(|r| Arc::clone(&r.region))
    };
    let Some(local) = local else {
        // The handle was made for another incarnation of this node (the
        // owner restarted): its region is gone for good, as a revoked one.
        let reason = format!("region #{region} of incarnation {incarnation:#018x} is gone (the owner restarted)");
        return Frame::Error { request, error: FabricError::PeerDead { node: shared.node, reason } };
    };
    let result = check_batch(local.name(), local.len(), ops)
        // The owner's own handle has every right, as its local region does.
        .and_then(|()| if from == shared.node { Ok(()) } else { local.access().check(local.name(), from, ops) })
        .and_then(|()| execute_on_memory(local.memory(), ops));
    match result {
        Ok(results) => Frame::OpsOk { request, results },
        Err(error) => Frame::Error { request, error },
    }
}

fn unknown_region(node: NodeId, name: &str) -> FabricError {
    FabricError::UnknownRegion { node, name: name.to_string() }
}
