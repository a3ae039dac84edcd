//! The host's resolver, as the proxy uses it: the hosts file by the exact name, then
//! getaddrinfo for the name's absolute form.
//!
//! A relative name would go through resolv.conf's `search` list (first of all when the name
//! has fewer dots than `ndots`, five in Kubernetes; after a failed lookup otherwise): the
//! policy checked `api.example.com`, and the proxy could reach whatever
//! `api.example.com.corp.internal` is. The trailing dot turns the list off, but glibc and
//! musl then find no hosts-file entry (it is matched as written, `localhost` is not
//! `localhost.`), so the file is read here first.

use std::io::Read;
use std::net::ToSocketAddrs;
use std::path::Path;

use super::*;

/// The hosts file the system's resolver reads before DNS.
const HOSTS: &str = "/etc/hosts";
/// Bytes of the hosts file read at most; the rest is not looked at.
const MAX_HOSTS_BYTES: u64 = 1 << 20;

/// The host's resolver, on tokio's blocking pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> ResolveFuture<'a> {
        let name = name.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || resolve_blocking(Path::new(HOSTS), &name))
                .await
                .map_err(|error| ResolveError::Lookup(io::Error::other(error)))?
        })
    }
}

/// Whether `address` is assigned to one of the host's interfaces now. Fails closed: when
/// the interfaces cannot be listed, every address counts as the host's.
pub(super) fn is_this_host(address: IpAddr) -> bool {
    let wanted = address.to_canonical();
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return true;
    };
    interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .any(|own| own.to_canonical() == wanted)
}

/// Resolves `name` (validated, lower case, without a trailing dot): its entries in the
/// hosts file at `hosts` if it has any, else what getaddrinfo answers for its absolute form.
fn resolve_blocking(hosts: &Path, name: &str) -> Result<Vec<IpAddr>, ResolveError> {
    let listed = read_hosts(hosts)
        .map(|text| from_hosts(&text, name))
        .unwrap_or_default();
    if !listed.is_empty() {
        return Ok(listed);
    }
    let found = (lookup_name(name).as_str(), 0)
        .to_socket_addrs()
        .map_err(ResolveError::Lookup)?;
    // getaddrinfo repeats an address once per socket type.
    let mut addresses: Vec<IpAddr> = Vec::new();
    for address in found {
        if !addresses.contains(&address.ip()) {
            addresses.push(address.ip());
        }
    }
    if addresses.is_empty() {
        Err(ResolveError::NotFound)
    } else {
        Ok(addresses)
    }
}

/// What getaddrinfo is asked for `name`: its absolute form, which no `search` domain is
/// appended to.
fn lookup_name(name: &str) -> String {
    format!("{name}.")
}

/// The hosts file's text; `None` if it cannot be read (then only DNS answers).
fn read_hosts(path: &Path) -> Option<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_HOSTS_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The addresses a hosts file's `text` gives `name`, in the file's order: every line that
/// lists it as its canonical name or an alias, compared without regard to case.
fn from_hosts(text: &str, name: &str) -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        // Addresses with a zone (`fe80::1%eth0`) do not parse and are passed over.
        let Some(Ok(address)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|listed| listed.eq_ignore_ascii_case(name)) && !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_looked_up_in_their_absolute_form() {
        assert_eq!(lookup_name("api.example.com"), "api.example.com.");
        assert_eq!(lookup_name("localhost"), "localhost.");
    }

    #[test]
    fn the_hosts_file_is_matched_by_the_exact_name() {
        let text = "# a comment naming web.test\n\
                    127.0.0.1\tlocalhost\n\
                    10.0.0.5 web.test Web.Alias # web.test again\n\
                    ::1 localhost ip6-localhost\n\
                    10.0.0.6 web.test.corp.internal\n\
                    fe80::1%eth0 web.test\n\
                    not-an-address web.test\n\
                    10.0.0.5 web.test\n\
                    10.0.0.7 other.test web.test\n";
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(
            from_hosts(text, "web.test"),
            vec![ip("10.0.0.5"), ip("10.0.0.7")]
        );
        assert_eq!(from_hosts(text, "web.alias"), vec![ip("10.0.0.5")]);
        assert_eq!(
            from_hosts(text, "localhost"),
            vec![ip("127.0.0.1"), ip("::1")]
        );
        assert!(from_hosts(text, "test").is_empty());
        assert!(from_hosts(text, "comment").is_empty());
    }

    #[test]
    fn a_name_in_the_hosts_file_is_not_asked_of_dns() {
        let path = std::env::temp_dir().join(format!("airlock-hosts-{}", std::process::id()));
        std::fs::write(&path, "192.0.2.10 only-in-this-file.invalid\n").unwrap();
        let found = resolve_blocking(&path, "only-in-this-file.invalid");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            found.unwrap(),
            vec!["192.0.2.10".parse::<IpAddr>().unwrap()]
        );
    }

    #[tokio::test]
    async fn names_in_the_hosts_file_resolve() {
        let hosts = read_hosts(Path::new(HOSTS)).unwrap_or_default();
        if from_hosts(&hosts, "localhost").is_empty() {
            eprintln!("SKIP: {HOSTS} does not list localhost");
            return;
        }
        let addresses = SystemResolver.resolve("localhost").await.unwrap();
        assert!(!addresses.is_empty());
        assert!(addresses.iter().all(|ip| ip.is_loopback()), "{addresses:?}");
    }
}
