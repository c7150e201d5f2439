//! Network namespaces joined to this host by a veth pair: what runs inside one reaches only
//! its own loopback and this host's end of the pair.

/// A network namespace joined to this host by a veth pair, removed when dropped.
pub struct Netns {
    pub name: String,
    pub host_ip: String,
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip").args(args).output().expect("the `ip` command (iproute2) is required");
    assert!(
        out.status.success(),
        "`ip {}` failed: {} (these tests need root and iproute2, as CI has; they fail rather than skip)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Netns {
    pub fn create() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}{n}", std::process::id() % 100_000);
        let name = format!("sgx{tag}");
        let (host_if, ns_if) = (format!("sgh{tag}"), format!("sgn{tag}"));
        // A /30 of 10.213.0.0/16 chosen by pid and counter, so parallel tests don't collide.
        let block = (std::process::id() * 8 + n) % 16_384;
        let (third, fourth) = (block / 64, (block % 64) * 4);
        let host_ip = format!("10.213.{third}.{}", fourth + 1);
        let ns_ip = format!("10.213.{third}.{}", fourth + 2);
        let netns = Self { name: name.clone(), host_ip: host_ip.clone() };
        ip(&["netns", "add", &name]);
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if]);
        ip(&["link", "set", &ns_if, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&["netns", "exec", &name, "ip", "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if]);
        ip(&["netns", "exec", &name, "ip", "link", "set", &ns_if, "up"]);
        ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        netns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the veth pair, and with it ours.
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The namespace's own address on the veth pair [`Netns::create`] sets up: its /30 gives the
/// host `.1` mod 4 and the namespace the next address.
pub fn netns_ip(netns: &Netns) -> String {
    let (prefix, last) = netns.host_ip.rsplit_once('.').expect("an IPv4 host address");
    format!("{prefix}.{}", last.parse::<u8>().expect("an IPv4 host address") + 1)
}
