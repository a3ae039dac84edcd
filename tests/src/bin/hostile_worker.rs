//! A hostile worker for the protocol tests: the supervisor execs it instead of the real
//! worker, and it breaks the protocol in the way its last argument names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

use airlock_protocol::frame::encode_frame;
use airlock_protocol::{
    AppliedIsolation, ExitStatus, LogLevel, LogRecord, PROTOCOL_VERSION, SupervisorMessage,
    ToolExit, WorkerMessage, read_frame, write_frame,
};

fn handshake(stream: &mut UnixStream) {
    write_frame(
        stream,
        &WorkerMessage::Hello {
            version: PROTOCOL_VERSION,
        },
    )
    .unwrap();
    let _: Option<SupervisorMessage> = read_frame(stream).unwrap();
    let _: Option<SupervisorMessage> = read_frame(stream).unwrap();
}

fn ready(stream: &mut UnixStream) {
    write_frame(stream, &WorkerMessage::Ready(applied())).unwrap();
    let _: Option<SupervisorMessage> = read_frame(stream).unwrap();
}

/// Sends `message` with `fds` attached (`SCM_RIGHTS`), as a worker passes its egress listener.
fn send_with_descriptors(stream: &UnixStream, message: &WorkerMessage, fds: &[i32]) {
    use std::os::fd::AsRawFd;
    let frame = encode_frame(message).unwrap();
    let payload = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: frame.as_ptr() as *mut libc::c_void,
        iov_len: frame.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = space;
    // SAFETY: the control buffer has CMSG_SPACE(payload) bytes, so the first header and its
    // data fit; the pointers stay valid for the sendmsg below.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&header);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<i32>(), fds.len());
    }
    // SAFETY: header points at live buffers described above.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &header, 0) };
    assert_eq!(sent, frame.len() as isize);
}

fn applied() -> AppliedIsolation {
    AppliedIsolation {
        namespaces: vec![],
        landlock_abi: 0,
        landlock_fully_enforced: false,
        seccomp_installed: false,
        seccomp_listener: false,
        landlock_logged: false,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fd: i32 = args[2].parse().unwrap();
    // SAFETY: the supervisor handed us this socket descriptor.
    let mut stream = unsafe { UnixStream::from_raw_fd(fd) };
    let mode = args.get(3).map(String::as_str).unwrap_or("silent");
    match mode {
        // Dies of a signal after the handshake, as a worker with a memory bug would.
        "crash" => {
            handshake(&mut stream);
            std::process::abort();
        }
        // Leaves cleanly right after saying hello, before the call is done.
        "early-exit" => {
            write_frame(
                &mut stream,
                &WorkerMessage::Hello {
                    version: PROTOCOL_VERSION,
                },
            )
            .unwrap();
            std::process::exit(0);
        }
        "huge-prefix" => stream
            .write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3])
            .unwrap(),
        "garbage" => stream
            .write_all(&[0, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef])
            .unwrap(),
        "bad-version" => write_frame(&mut stream, &WorkerMessage::Hello { version: 999 }).unwrap(),
        "out-of-order" => {
            let exit = ToolExit {
                status: ExitStatus::Code(0),
                stdout: vec![],
                stderr: vec![],
                stdout_truncated: false,
                stderr_truncated: false,
                user_cpu_us: 0,
                system_cpu_us: 0,
                worker_cpu_us: 0,
                cpu_limit_reached: None,
                stopped: false,
            };
            write_frame(&mut stream, &WorkerMessage::Exited(exit)).unwrap();
        }
        "trailing" => {
            let mut frame = encode_frame(&WorkerMessage::Hello {
                version: PROTOCOL_VERSION,
            })
            .unwrap();
            frame.extend_from_slice(&[1, 2, 3]);
            let len = (frame.len() - 4) as u32;
            frame[..4].copy_from_slice(&len.to_be_bytes());
            stream.write_all(&frame).unwrap();
        }
        "truncated" => {
            let frame = encode_frame(&WorkerMessage::Hello {
                version: PROTOCOL_VERSION,
            })
            .unwrap();
            stream.write_all(&frame[..frame.len() / 2]).unwrap();
            // Then hang up mid-frame (a worker that only stalls is caught by the deadline).
            drop(stream);
            std::thread::sleep(std::time::Duration::from_secs(60));
            return;
        }
        "length-bomb" => {
            // Variant 3 (Log), LogLevel::Info, then a string whose varint length (253 = u64
            // follows) claims 2^60 bytes.
            let mut body = vec![3u8, 1];
            body.push(253);
            body.extend_from_slice(&(1u64 << 60).to_le_bytes());
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(&body);
            stream.write_all(&frame).unwrap();
        }
        "log-flood" => {
            handshake(&mut stream);
            for _ in 0..10_000 {
                let log = WorkerMessage::Log(LogRecord {
                    level: LogLevel::Info,
                    message: "flood".into(),
                });
                if write_frame(&mut stream, &log).is_err() {
                    break;
                }
            }
        }
        "oversized-report" => {
            handshake(&mut stream);
            ready(&mut stream);
            let exit = ToolExit {
                status: ExitStatus::Code(0),
                stdout: vec![b'x'; 8 << 20],
                stderr: vec![],
                stdout_truncated: false,
                stderr_truncated: false,
                user_cpu_us: 0,
                system_cpu_us: 0,
                worker_cpu_us: 0,
                cpu_limit_reached: None,
                stopped: false,
            };
            let _ = write_frame(&mut stream, &WorkerMessage::Exited(exit));
        }
        // Says Ready and nothing else: an egress profile's worker that passes no listener.
        "ready" => {
            handshake(&mut stream);
            ready(&mut stream);
        }
        // Passes a pipe with Ready: a descriptor nobody asked for, or a listener that is none.
        "pass-pipe" => {
            handshake(&mut stream);
            let (read, _write) = std::io::pipe().unwrap();
            use std::os::fd::AsRawFd;
            send_with_descriptors(
                &stream,
                &WorkerMessage::Ready(applied()),
                &[read.as_raw_fd()],
            );
        }
        // Passes three descriptors at once.
        "pass-many" => {
            handshake(&mut stream);
            send_with_descriptors(&stream, &WorkerMessage::Ready(applied()), &[0, 1, 2]);
        }
        "report-twice" => {
            handshake(&mut stream);
            write_frame(
                &mut stream,
                &WorkerMessage::Hello {
                    version: PROTOCOL_VERSION,
                },
            )
            .unwrap();
        }
        _ => {}
    }
    // Linger so the supervisor, not our exit, decides the outcome.
    let mut sink = [0u8; 1024];
    while let Ok(n) = stream.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_secs(60));
}
