//! The kernel's audit over `NETLINK_AUDIT`: its status, a record of our own, and the
//! read-log multicast group where every record is copied. Safe wrappers of `nix`; the
//! framing (`nlmsghdr`, `struct audit_status`) is done here by hand, in native byte order
//! as the kernel writes it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
    setsockopt, socket, sockopt,
};

/// `AUDIT_GET`: the audit's status.
const AUDIT_GET: u16 = 1000;
/// `AUDIT_SET`: change it (`CAP_AUDIT_CONTROL`).
const AUDIT_SET: u16 = 1001;
/// `AUDIT_TRUSTED_APP`: free text from a trusted program, in the user message range.
pub const AUDIT_TRUSTED_APP: u16 = 1121;
/// `AUDIT_NLGRP_READLOG`: the multicast group every record is copied to.
const AUDIT_NLGRP_READLOG: u32 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const HEADER: usize = 16;
/// `AUDIT_STATUS_ENABLED` in `audit_status.mask`.
const STATUS_ENABLED: u32 = 1;
/// The largest message the audit socket reads: a record is at most a few KiB (paths are
/// cut at `PATH_MAX`, hex-encoded at twice that); anything longer arrives truncated.
pub const MAX_MESSAGE: usize = 64 << 10;

/// What `AUDIT_GET` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditStatus {
    /// 0 off, 1 on, 2 on and locked.
    pub enabled: u32,
    /// Records the kernel dropped (backlog, rate limit, memory) since boot.
    pub lost: u32,
}

/// One netlink message out of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetlinkMessage<'a> {
    pub kind: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

/// A `NETLINK_AUDIT` socket: unicast only (requests and their answers), or joined to the
/// read-log group (`CAP_AUDIT_READ`).
pub fn audit_socket(read_log: bool) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkAudit,
    )?;
    let groups = if read_log {
        1 << (AUDIT_NLGRP_READLOG - 1)
    } else {
        0
    };
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, groups))?;
    if read_log {
        // Room for a burst while the reader is not scheduled; root may exceed rmem_max.
        let size = 8 << 20;
        if setsockopt(&fd, sockopt::RcvBufForce, &size).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &size);
        }
    }
    Ok(fd)
}

fn frame(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = HEADER + payload.len();
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(len.next_multiple_of(4), 0);
    out
}

fn send(fd: &OwnedFd, message: &[u8]) -> io::Result<()> {
    sendto(
        fd.as_raw_fd(),
        message,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    Ok(())
}

/// Receives one datagram into `buf`: its length, and whether it was cut.
pub fn receive(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, bool)> {
    let n = recv(fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC)?;
    Ok((n.min(buf.len()), n > buf.len()))
}

/// The messages of a datagram, in order; a malformed tail ends the list.
pub fn messages(mut datagram: &[u8]) -> Vec<NetlinkMessage<'_>> {
    let mut out = Vec::new();
    while datagram.len() >= HEADER {
        let word = |at: usize| {
            let mut b = [0; 4];
            b.copy_from_slice(&datagram[at..at + 4]);
            u32::from_ne_bytes(b)
        };
        let len = word(0) as usize;
        if len < HEADER || len > datagram.len() {
            break;
        }
        let kind = u16::from_ne_bytes([datagram[4], datagram[5]]);
        out.push(NetlinkMessage {
            kind,
            seq: word(8),
            payload: &datagram[HEADER..len],
        });
        datagram = &datagram[len.next_multiple_of(4).min(datagram.len())..];
    }
    out
}

/// Sends a request and waits for its answer (the message with its sequence number that is
/// not an empty acknowledgement), skipping anything else queued on the socket.
fn request(fd: &OwnedFd, kind: u16, seq: u32, payload: &[u8]) -> io::Result<Vec<u8>> {
    send(fd, &frame(kind, NLM_F_REQUEST | NLM_F_ACK, seq, payload))?;
    let mut buf = vec![0; 8192];
    // Each answer is at most an error and a status; anything more is stale.
    for _ in 0..16 {
        let (n, _) = receive(fd, &mut buf)?;
        for message in messages(&buf[..n]) {
            if message.seq != seq {
                continue;
            }
            if message.kind == NLMSG_ERROR {
                let code = message
                    .payload
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
                if kind != AUDIT_GET {
                    return Ok(Vec::new());
                }
                continue;
            }
            return Ok(message.payload.to_vec());
        }
    }
    Err(io::Error::from_raw_os_error(libc::EPROTO))
}

/// `AUDIT_GET`.
pub fn audit_status(fd: &OwnedFd, seq: u32) -> io::Result<AuditStatus> {
    let payload = request(fd, AUDIT_GET, seq, &[])?;
    let word = |at: usize| {
        payload
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EPROTO))
    };
    Ok(AuditStatus {
        enabled: word(4)?,
        lost: word(24)?,
    })
}

/// `AUDIT_SET` of `enabled` alone (`CAP_AUDIT_CONTROL`).
pub fn set_audit_enabled(fd: &OwnedFd, seq: u32, enabled: u32) -> io::Result<()> {
    // struct audit_status: mask, enabled, then fields the mask leaves alone.
    let mut payload = vec![0u8; 40];
    payload[..4].copy_from_slice(&STATUS_ENABLED.to_ne_bytes());
    payload[4..8].copy_from_slice(&enabled.to_ne_bytes());
    request(fd, AUDIT_SET, seq, &payload).map(drop)
}

/// Logs `text` as an `AUDIT_TRUSTED_APP` record (`CAP_AUDIT_WRITE`); with `ack`, waits for
/// the kernel to accept it.
pub fn log_user_record(fd: &OwnedFd, seq: u32, text: &str, ack: bool) -> io::Result<()> {
    let mut payload = text.as_bytes().to_vec();
    payload.push(0);
    if ack {
        request(fd, AUDIT_TRUSTED_APP, seq, &payload).map(drop)
    } else {
        send(fd, &frame(AUDIT_TRUSTED_APP, NLM_F_REQUEST, seq, &payload))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn framed_messages_are_read_back_and_a_cut_tail_is_ignored() {
        let mut datagram = frame(1423, 0, 7, b"audit(1.2:3): domain=1 blockers=x");
        datagram.extend(frame(1424, 0, 8, b"abc"));
        let listed = messages(&datagram);
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].kind, 1423);
        assert_eq!(listed[0].seq, 7);
        assert_eq!(listed[0].payload, b"audit(1.2:3): domain=1 blockers=x");
        assert_eq!(listed[1].payload, b"abc");
        // A length past the datagram, or below the header, ends the list.
        let mut bad = frame(1423, 0, 1, b"x");
        bad[0] = 200;
        assert!(messages(&bad).is_empty());
        bad[..4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(messages(&bad).is_empty());
        assert!(messages(&[1, 2, 3]).is_empty());
    }
}
