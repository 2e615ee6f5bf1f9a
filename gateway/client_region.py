"""Which region a request comes from, as this edge judges it (issue 16): set per request for the cluster
backend (cluster.geo.CLIENT_REGION), which measures where each partition's sends come from and offers a
worker the partitions owned in its region first.

The rule, first that applies (`RegionResolver.resolve`):
1. `X-Strictq-Region` with `--trust-region-header`: the header's region ("header");
2. the peer is a trusted front proxy (`--trusted-proxy`) and sent `X-Forwarded-For`: the right-most address
   of that chain that is not itself a trusted proxy (the one the proxy saw; whatever a client wrote to the
   left of it is not believed) is the client's, looked up in the CIDR table ("forwarded");
3. the client's address (the peer's, or the forwarded one) in the CIDR table, longest prefix ("address");
4. else the edge's own region: a client reaching this edge was sent here by geo DNS or anycast ("edge").
An untrusted `X-Strictq-Region` never moves a partition: it counts only when 2-4 know nothing (the edge has
no region), as "claimed", which orders that caller's own polling and is not measured. A header value that is
not a region name is ignored.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from cluster.geo import CLIENT_REGION, ClientRegion
from cluster.names import check_node_name
from protocol import headers

Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address
FORWARDED_FOR = "X-Forwarded-For"

__all__ = [
    "RegionResolver",
    "RegionTableError",
    "client_region_middleware",
    "load_table",
    "parse_address",
    "parse_network",
]


class RegionTableError(ValueError):
    """A client-region table (or a network given on the command line) that cannot be used; the message
    names the file and the key."""


def parse_network(text: str) -> Network:
    """A CIDR network (`10.1.0.0/16`, `2001:db8::/32`; a bare address is its /32 or /128). ValueError
    with a one-line reason, host bits included (`10.1.2.3/16` is a typo for a network or for a host)."""
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        reason = str(exc)
        if "host bits set" in reason:
            loose = ipaddress.ip_network(text.strip(), strict=False)
            raise ValueError(f"{text!r} has host bits set (the network is {loose})") from None
        raise ValueError(f"{text!r} is not an IPv4 or IPv6 network (CIDR, e.g. 10.1.0.0/16)") from None


def parse_address(text: str) -> Address | None:
    """A client address as a peer or an `X-Forwarded-For` entry spells it (`10.0.0.1`, `10.0.0.1:5000`,
    `[2001:db8::1]:443`, `fe80::1%eth0`), an IPv4-mapped IPv6 address as its IPv4; None if it is none."""
    text = text.strip()
    if text.startswith("["):  # [v6] or [v6]:port
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    text = text.split("%", 1)[0]  # an IPv6 zone
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def load_table(path: Path) -> list[tuple[Network, str]]:
    """The client-region table of `--client-regions`: a TOML file with a `[regions]` table of
    `"<CIDR>" = "<region>"` entries. RegionTableError names the file and the bad key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegionTableError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise RegionTableError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegionTableError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - {"regions"})
    if unknown:
        raise RegionTableError(f"{path}: unknown key {unknown[0]!r}: only a [regions] table")
    regions = data.get("regions")
    if not isinstance(regions, dict):
        raise RegionTableError(f'{path}: no [regions] table (lines like "10.1.0.0/16" = "eu" under it)')
    table: dict[Network, str] = {}
    for key, value in regions.items():
        try:
            network = parse_network(key)
        except ValueError as exc:
            raise RegionTableError(f"{path}: [regions] key {exc}") from None
        if not isinstance(value, str):
            raise RegionTableError(f"{path}: [regions] {key!r}: the region must be a string, not {value!r}")
        if problem := check_node_name(value, "region"):
            raise RegionTableError(f"{path}: [regions] {key!r}: {problem}")
        if table.get(network, value) != value:
            raise RegionTableError(
                f"{path}: [regions] {key!r}: {network} is already given region {table[network]!r}"
            )
        table[network] = value
    return sorted(table.items(), key=lambda item: (item[0].version, item[0]))


class RegionResolver:
    """The rule of this module's docstring, for one edge: its region, CIDR table, trusted proxies and
    whether it trusts the region header."""

    def __init__(
        self,
        edge_region: str,
        table: Sequence[tuple[Network, str]] = (),
        trusted_proxies: Sequence[Network] = (),
        trust_header: bool = False,
    ) -> None:
        self.edge_region = edge_region
        self.trust_header = trust_header
        self.trusted_proxies = tuple(trusted_proxies)
        # Longest prefix first: per (IP version, prefix length), a dict from network to region.
        self._by_prefix: list[tuple[int, int, dict[Network, str]]] = []
        grouped: dict[tuple[int, int], dict[Network, str]] = {}
        for network, region in table:
            grouped.setdefault((network.version, network.prefixlen), {})[network] = region
        for (version, length), networks in sorted(grouped.items(), key=lambda kv: -kv[0][1]):
            self._by_prefix.append((version, length, networks))

    def lookup(self, address: Address) -> str:
        """The table's region of `address` (the longest matching prefix), or ""."""
        for version, length, networks in self._by_prefix:
            if version != address.version:
                continue
            region = networks.get(ipaddress.ip_network((address, length), strict=False))
            if region is not None:
                return region
        return ""

    def is_trusted_proxy(self, address: Address) -> bool:
        return any(address in network for network in self.trusted_proxies)

    def resolve(self, peer: str | None, request_headers: Mapping[str, str]) -> ClientRegion:
        """The client region of a request from `peer` (aiohttp's `request.remote`) with these headers."""
        raw_claim = request_headers.get(headers.REGION)
        claim = raw_claim.strip() if raw_claim is not None else ""
        if claim and check_node_name(claim, "region"):
            claim = ""  # not a region name: as if absent
        if claim and self.trust_header:
            return ClientRegion(claim, "header")
        found = self._from_network(peer, request_headers)
        if claim and not found.region:
            return ClientRegion(claim, "claimed")
        return found

    def _from_network(self, peer: str | None, request_headers: Mapping[str, str]) -> ClientRegion:
        """Rules 2-4: the client's address (behind a trusted proxy: from its X-Forwarded-For), the table."""
        address = parse_address(peer) if peer else None
        forwarded = False
        if address is not None and self.trusted_proxies and self.is_trusted_proxy(address):
            chain = _forwarded_chain(request_headers)
            if chain:
                address, forwarded = self._client_in(chain), True
        region = self.lookup(address) if address is not None else ""
        if region:
            return ClientRegion(region, "forwarded" if forwarded else "address")
        return ClientRegion(self.edge_region, "edge")

    def _client_in(self, chain: list[str]) -> Address | None:
        """The right-most address of a forwarded chain that is not a trusted proxy (each trusted proxy
        appends the address it saw; what is left of the first untrusted one anybody may have written). All
        trusted: the left-most. An entry that is not an address where the client should be: unknown."""
        for entry in reversed(chain):
            address = parse_address(entry)
            if address is None:
                return None
            if not self.is_trusted_proxy(address):
                return address
        return parse_address(chain[0])


def _forwarded_chain(request_headers: Mapping[str, str]) -> list[str]:
    """Every X-Forwarded-For entry, in order, over repeated headers."""
    getall = getattr(request_headers, "getall", None)
    values: Iterable[str]
    if getall is not None:
        values = getall(FORWARDED_FOR, [])
    else:
        one = request_headers.get(FORWARDED_FOR)
        values = [one] if one is not None else []
    return [entry.strip() for value in values for entry in value.split(",") if entry.strip()]


def client_region_middleware(resolver: RegionResolver) -> Middleware:
    """An aiohttp middleware setting cluster.geo.CLIENT_REGION for the request's handler, reset after."""

    @web.middleware
    async def client_region(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = CLIENT_REGION.set(resolver.resolve(request.remote, request.headers))
        try:
            return await handler(request)
        finally:
            CLIENT_REGION.reset(token)

    return client_region
