"""Which IP addresses a tenant's traffic may go to: `address_refusal(address)`, the one check
behind the connectors' SSRF guard and the sandboxes' egress proxy. Imports no app.

An explicit table rather than `ipaddress.is_global`, whose answer changes between Python
versions (3.11 calls 6to4 and the deprecated site-local fec0::/10 global). IPv4: anything in
the IANA special-purpose ranges is refused. IPv6: only global unicast (2000::/3) outside its
special ranges; the forms that carry an IPv4 address (mapped, 6to4, Teredo, NAT64) are judged by
the IPv4 address they carry.
"""

import ipaddress

IPv4_DENIED = tuple(ipaddress.ip_network(net) for net in (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # private
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",  # loopback
    "169.254.0.0/16",  # link-local, cloud metadata
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24",  # documentation
    "192.31.196.0/24", "192.52.193.0/24", "192.175.48.0/24",  # AS112, AMT
    "192.88.99.0/24",  # 6to4 relay anycast
    "198.18.0.0/15",  # benchmarking
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the broadcast address
))
IPv6_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
IPv6_DENIED = tuple(ipaddress.ip_network(net) for net in (
    "2001::/23",  # IETF protocol assignments (Teredo, 2001::/32, is unwrapped before this)
    "2001:db8::/32", "3fff::/20",  # documentation
))
MAPPED = ipaddress.ip_network("::ffff:0:0/96")
SIXTOFOUR = ipaddress.ip_network("2002::/16")
TEREDO = ipaddress.ip_network("2001::/32")
NAT64 = ipaddress.ip_network("64:ff9b::/96")


def address_refusal(address: str) -> str:
    """Why tenant traffic may not go to `address` ("" if it may). A scope (`%eth0`) is ignored:
    a scoped address is link-local, refused anyway. Not an IP address: refused."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv4Address):
        return f"{ip} is not a public address" if _ipv4_denied(ip) else ""
    carried = _carried(ip)
    if carried:
        bad = [str(inner) for inner in carried if _ipv4_denied(inner)]
        return f"{ip} carries {', '.join(bad)}, which is not a public address" if bad else ""
    if ip not in IPv6_GLOBAL_UNICAST or any(ip in net for net in IPv6_DENIED):
        return f"{ip} is not a public address"
    return ""


def _ipv4_denied(ip: ipaddress.IPv4Address) -> bool:
    return any(ip in net for net in IPv4_DENIED)


def _carried(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address hands traffic to (Teredo: its server and client)."""
    if ip in MAPPED:
        return [ipaddress.IPv4Address(ip.packed[-4:])]
    if ip in NAT64:
        return [ipaddress.IPv4Address(ip.packed[-4:])]
    if ip in SIXTOFOUR:
        return [ipaddress.IPv4Address(ip.packed[2:6])]
    if ip in TEREDO:
        server, client = ip.teredo
        return [server, client]
    return []
