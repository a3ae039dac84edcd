//! The server side of a SOCKS5 handshake (RFC 1928): the "no authentication" method only,
//! the CONNECT command only, destinations as a domain name, IPv4 or IPv6 address.
//!
//! No authentication is needed: the proxy's socket is reachable only from the one worker's
//! network namespace, so whoever connects is that worker.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use airlock_policy::egress::{Host, HostError};

/// The protocol version byte, also the first byte a SOCKS5 client sends.
pub const VERSION: u8 = 5;
const METHOD_NO_AUTH: u8 = 0x00;
const METHOD_NONE_ACCEPTABLE: u8 = 0xff;
const COMMAND_CONNECT: u8 = 0x01;
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// A reply code (RFC 1928 section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// `0x00`.
    Succeeded,
    /// `0x01`: malformed requests and anything else.
    GeneralFailure,
    /// `0x02`: refused by the egress policy or a limit.
    NotAllowed,
    /// `0x03`.
    NetworkUnreachable,
    /// `0x04`: the name did not resolve, or the host did not answer.
    HostUnreachable,
    /// `0x05`.
    ConnectionRefused,
    /// `0x07`: not CONNECT.
    CommandNotSupported,
    /// `0x08`.
    AddressTypeNotSupported,
}

impl Reply {
    /// The byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Reply::Succeeded => 0x00,
            Reply::GeneralFailure => 0x01,
            Reply::NotAllowed => 0x02,
            Reply::NetworkUnreachable => 0x03,
            Reply::HostUnreachable => 0x04,
            Reply::ConnectionRefused => 0x05,
            Reply::CommandNotSupported => 0x07,
            Reply::AddressTypeNotSupported => 0x08,
        }
    }
}

/// A CONNECT request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocksRequest {
    /// The destination host (a domain name that is an IP literal becomes [`Host::Ip`]).
    pub host: Host,
    /// The destination port (0 is left for the policy to refuse).
    pub port: u16,
}

/// Why the handshake gave no request.
#[derive(Debug, thiserror::Error)]
pub enum SocksError {
    /// The client closed mid-handshake.
    #[error("the client closed the connection during the SOCKS handshake")]
    Closed,
    /// Reading or writing failed.
    #[error("SOCKS handshake I/O failed: {0}")]
    Io(#[source] io::Error),
    /// A version byte other than 5.
    #[error("SOCKS version {0:#04x} is not 5")]
    Version(u8),
    /// The client does not offer "no authentication".
    #[error("the client offers no method this proxy accepts (only no-authentication)")]
    NoAcceptableMethod,
    /// A command other than CONNECT.
    #[error("SOCKS command {0:#04x} is not supported (only CONNECT)")]
    Command(u8),
    /// An unknown address type.
    #[error("SOCKS address type {0:#04x} is not supported")]
    AddressType(u8),
    /// A non-zero reserved byte.
    #[error("SOCKS reserved byte is {0:#04x}, not 0")]
    Reserved(u8),
    /// A domain name that is not a valid host.
    #[error("bad SOCKS destination name: {0}")]
    Host(HostError),
}

impl SocksError {
    /// The reply to send before closing, if any. None where the client has already been
    /// answered (no acceptable method) or cannot be (it closed, I/O failed).
    pub fn reply(&self) -> Option<Reply> {
        match self {
            SocksError::Command(_) => Some(Reply::CommandNotSupported),
            SocksError::AddressType(_) => Some(Reply::AddressTypeNotSupported),
            SocksError::Version(_) | SocksError::Reserved(_) | SocksError::Host(_) => {
                Some(Reply::GeneralFailure)
            }
            SocksError::Closed | SocksError::Io(_) | SocksError::NoAcceptableMethod => None,
        }
    }
}

fn io_error(error: io::Error) -> SocksError {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        SocksError::Closed
    } else {
        SocksError::Io(error)
    }
}

/// Runs the method negotiation and reads the request. Reads only the bytes the handshake
/// defines (at most 2 + 255 + 4 + 1 + 255 + 2), so any data the client sends after its
/// request stays in the stream for the tunnel.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Result<SocksRequest, SocksError> {
    let mut greeting = [0u8; 2];
    stream.read_exact(&mut greeting).await.map_err(io_error)?;
    let [version, count] = greeting;
    if version != VERSION {
        return Err(SocksError::Version(version));
    }
    let mut methods = [0u8; 255];
    let methods = methods.get_mut(..usize::from(count)).unwrap_or_default();
    stream.read_exact(methods).await.map_err(io_error)?;
    if !methods.contains(&METHOD_NO_AUTH) {
        stream
            .write_all(&[VERSION, METHOD_NONE_ACCEPTABLE])
            .await
            .map_err(io_error)?;
        return Err(SocksError::NoAcceptableMethod);
    }
    stream
        .write_all(&[VERSION, METHOD_NO_AUTH])
        .await
        .map_err(io_error)?;

    let mut request = [0u8; 4];
    stream.read_exact(&mut request).await.map_err(io_error)?;
    let [version, command, reserved, address_type] = request;
    if version != VERSION {
        return Err(SocksError::Version(version));
    }
    if command != COMMAND_CONNECT {
        return Err(SocksError::Command(command));
    }
    if reserved != 0 {
        return Err(SocksError::Reserved(reserved));
    }
    let host = match address_type {
        ATYP_IPV4 => {
            let mut octets = [0u8; 4];
            stream.read_exact(&mut octets).await.map_err(io_error)?;
            Host::Ip(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        ATYP_IPV6 => {
            let mut octets = [0u8; 16];
            stream.read_exact(&mut octets).await.map_err(io_error)?;
            Host::Ip(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        ATYP_DOMAIN => {
            let mut length = [0u8; 1];
            stream.read_exact(&mut length).await.map_err(io_error)?;
            let mut name = [0u8; 255];
            let name = name.get_mut(..usize::from(length[0])).unwrap_or_default();
            stream.read_exact(name).await.map_err(io_error)?;
            let name = std::str::from_utf8(name).map_err(|e| {
                SocksError::Host(HostError::NonAscii {
                    at: e.valid_up_to(),
                })
            })?;
            Host::parse(name).map_err(SocksError::Host)?
        }
        other => return Err(SocksError::AddressType(other)),
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port).await.map_err(io_error)?;
    Ok(SocksRequest {
        host,
        port: u16::from_be_bytes(port),
    })
}

/// A reply message. Its bound address is always `0.0.0.0:0`: on success it would be the
/// proxy's local address of the upstream connection, the host's own source address and
/// port, which the sandbox has no need to learn (clients do not use it for `CONNECT`).
pub fn encode_reply(reply: Reply) -> Vec<u8> {
    let mut message = vec![VERSION, reply.code(), 0, ATYP_IPV4];
    message.extend_from_slice(&Ipv4Addr::UNSPECIFIED.octets());
    message.extend_from_slice(&0u16.to_be_bytes());
    message
}

/// Writes a reply.
pub async fn send_reply<S: AsyncWrite + Unpin>(stream: &mut S, reply: Reply) -> io::Result<()> {
    stream.write_all(&encode_reply(reply)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `accept` against `input`; returns its result and what it wrote.
    async fn run(input: &[u8]) -> (Result<SocksRequest, SocksError>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(4096);
        client.write_all(input).await.unwrap();
        // End the input, so a short message is seen as the client closing.
        client.shutdown().await.unwrap();
        let result = accept(&mut server).await;
        drop(server);
        let mut written = Vec::new();
        client.read_to_end(&mut written).await.unwrap();
        (result, written)
    }

    #[tokio::test]
    async fn connect_requests_of_every_address_type() {
        let (result, written) =
            run(b"\x05\x02\x02\x00\x05\x01\x00\x03\x0bExample.COM\x01\xbb").await;
        assert_eq!(written, [5, 0]);
        assert_eq!(
            result.unwrap(),
            SocksRequest {
                host: Host::Name("example.com".into()),
                port: 443
            }
        );
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50").await;
        assert_eq!(
            result.unwrap(),
            SocksRequest {
                host: Host::Ip("127.0.0.1".parse().unwrap()),
                port: 80
            }
        );
        let mut v6 = b"\x05\x01\x00\x05\x01\x00\x04".to_vec();
        v6.extend_from_slice(&"::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0x1f, 0x90]);
        let (result, _) = run(&v6).await;
        assert_eq!(
            result.unwrap(),
            SocksRequest {
                host: Host::Ip("::1".parse().unwrap()),
                port: 8080
            }
        );
        // A domain name that is an IP literal is treated as one.
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x03\x0810.0.0.1\x00\x50").await;
        assert_eq!(result.unwrap().host, Host::Ip("10.0.0.1".parse().unwrap()));
    }

    #[tokio::test]
    async fn refusals_carry_the_rfc_reply_codes() {
        let (result, written) = run(b"\x05\x01\x02").await;
        assert!(matches!(result, Err(SocksError::NoAcceptableMethod)));
        assert_eq!(written, [5, 0xff]);
        let (result, _) = run(b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50").await;
        let error = result.unwrap_err();
        assert!(matches!(error, SocksError::Command(2)));
        assert_eq!(error.reply(), Some(Reply::CommandNotSupported));
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x09").await;
        let error = result.unwrap_err();
        assert!(matches!(error, SocksError::AddressType(9)));
        assert_eq!(error.reply(), Some(Reply::AddressTypeNotSupported));
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x03\x03a b\x00\x50").await;
        assert_eq!(result.unwrap_err().reply(), Some(Reply::GeneralFailure));
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x03\x02\xc3\xa9\x00\x50").await;
        assert!(matches!(
            result,
            Err(SocksError::Host(HostError::NonAscii { at: 0 }))
        ));
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x03\x00\x00\x50").await;
        assert!(matches!(result, Err(SocksError::Host(HostError::Empty))));
        let (result, _) = run(b"\x05\x01\x00\x04\x01\x00\x01").await;
        assert!(matches!(result, Err(SocksError::Version(4))));
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x01\x01").await;
        assert!(matches!(result, Err(SocksError::Reserved(1))));
        let (result, _) = run(b"\x05\x01\x00\x05\x01\x00\x03\x05ab").await;
        assert!(matches!(result, Err(SocksError::Closed)));
    }

    #[test]
    fn replies_are_encoded() {
        assert_eq!(
            encode_reply(Reply::NotAllowed),
            [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            encode_reply(Reply::Succeeded),
            [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        );
        for (reply, code) in [
            (Reply::GeneralFailure, 1),
            (Reply::HostUnreachable, 4),
            (Reply::ConnectionRefused, 5),
            (Reply::CommandNotSupported, 7),
            (Reply::AddressTypeNotSupported, 8),
        ] {
            assert_eq!(reply.code(), code);
        }
    }
}
