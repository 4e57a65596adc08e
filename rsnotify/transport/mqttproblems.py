"""One line per broker problem, saying what to change (pure).

Every MQTT client of rsnotify (publisher, ``--mqtt-only`` gateway,
subscriber, dashboard) reports a failed connection or a refused topic with
the same words, built here from what paho saw: the CONNACK reason code (MQTT
5 section 3.2.2.2; paho maps MQTT 3.1.1 return codes 1-5 onto the same
codes), the socket error, or a subscription or publication refused.  A line
names the broker (password redacted), what happened, and the option or
broker setting to change.  The retry policy is appended by the caller
(:mod:`.mqttlink`), which owns it.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Literal

from .mqtturl import BrokerURL

Kind = Literal["protocol", "refused", "unreachable"]

UNSUPPORTED_PROTOCOL = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USER_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
BAD_AUTH_METHOD = 0x8C
TOPIC_NAME_INVALID = 0x90
CONNECTION_RATE_EXCEEDED = 0x9F
#: Refusals that waiting a little will not fix: retry at the longest interval at once.
LASTING = {
    UNSUPPORTED_PROTOCOL,
    CLIENT_ID_NOT_VALID,
    BAD_USER_OR_PASSWORD,
    NOT_AUTHORIZED,
    BANNED,
    BAD_AUTH_METHOD,
}


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a connection attempt failed: ``kind`` for the state, ``line`` for the operator."""

    kind: Kind
    line: str
    lasting: bool = False


@dataclass(frozen=True, slots=True)
class Context:
    """Who is connecting where, and through which option, for the wording."""

    broker: BrokerURL
    option: str = "--mqtt"  # the option that holds the broker URL (--mqtt, --via)
    client_id: str = ""

    @property
    def where(self) -> str:
        return f"MQTT broker {self.broker.redacted()}"

    @property
    def account(self) -> str:
        user = self.broker.username
        return f"user {user!r}" if user else "anonymous clients"

    @property
    def url_form(self) -> str:
        return f"{self.broker.scheme}://USER:PASSWORD@{self.broker.host}:{self.broker.port}"


def refused(code: int, name: str, ctx: Context, protocol: str) -> Problem:
    """A CONNACK with a failure reason code ``code`` (``name`` as paho spells it)."""
    where, option = ctx.where, ctx.option
    if code == UNSUPPORTED_PROTOCOL:
        return Problem(
            "protocol",
            f"{where} refused MQTT {protocol} ({name}): it speaks neither MQTT 5 nor 3.1.1 as "
            f"rsnotify asked; check that {option} names an MQTT listener, or set "
            "--mqtt-protocol to the version it speaks",
            lasting=True,
        )
    if code == CLIENT_ID_NOT_VALID:
        line = (
            f"{where} refused client id {ctx.client_id!r} ({name}): allow it in the broker's "
            "configuration (MQTT 3.1.1 section 3.1.3.1 only guarantees 1-23 letters and digits)"
        )
    elif code == BAD_USER_OR_PASSWORD and not ctx.broker.username:
        line = (
            f"{where} requires a user name and password ({name}): put them in {option} "
            f"({ctx.url_form})"
        )
    elif code == BAD_USER_OR_PASSWORD:
        line = (
            f"{where} refused {ctx.account} ({name}): fix USER:PASSWORD in {option} "
            f"({ctx.url_form}) or the broker's password file"
        )
    elif code == NOT_AUTHORIZED and not ctx.broker.username:
        line = (
            f"{where} refuses {ctx.account} ({name}): put a user name and password in {option} "
            f"({ctx.url_form})"
        )
    elif code == NOT_AUTHORIZED:
        # MQTT 3.1.1 brokers (NATS) answer a wrong password with "not authorized" too.
        line = (
            f"{where} refused {ctx.account} ({name}): check USER:PASSWORD in {option} "
            f"({ctx.url_form}), and that the broker lets this account connect"
        )
    elif code in (SERVER_UNAVAILABLE, SERVER_BUSY, CONNECTION_RATE_EXCEEDED):
        line = f"{where} cannot take the connection now ({name}): it may be starting or overloaded"
    elif code == BANNED:
        line = f"{where} has banned this client ({name}): ask the broker's operator"
    else:
        line = f"{where} refused the connection ({name}): see the broker's log"
    return Problem("refused", line, lasting=code in LASTING)


def unreachable(exc: BaseException, ctx: Context, timeout: float) -> Problem:
    """The TCP (or TLS) connection itself failed."""
    where, option = ctx.where, ctx.option
    host, port = ctx.broker.host, ctx.broker.port
    if isinstance(exc, ConnectionRefusedError):
        line = (
            f"{where} is unreachable: nothing accepts connections on {host}:{port} (connection "
            f"refused); start the broker, or fix the host and port in {option}"
        )
    elif isinstance(exc, socket.gaierror):
        line = (
            f"{where} is unreachable: cannot resolve host {host!r} ({exc.strerror}); fix the "
            f"host name in {option}"
        )
    elif isinstance(exc, TimeoutError | socket.timeout):
        line = (
            f"{where} is unreachable: no answer from {host}:{port} within {timeout:g} s; check "
            f"the host and port in {option} and any firewall on the way"
        )
    elif isinstance(exc, ssl.SSLCertVerificationError):
        line = (
            f"{where}: its TLS certificate is not trusted "
            f"({getattr(exc, 'verify_message', exc)}, {getattr(exc, 'reason', '')}); "
            "give its CA with --mqtt-ca, or use the host name the certificate names"
        )
    elif isinstance(exc, ssl.SSLError):
        line = (
            f"{where}: the TLS handshake failed ({getattr(exc, 'reason', None) or exc}); "
            "mqtts:// needs the broker's TLS listener (usually port 8883), mqtt:// its plain one"
        )
    else:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        line = f"{where} is unreachable: {why}; check the network and the URL in {option}"
    return Problem("unreachable", line)


def no_connack(ctx: Context, timeout: float) -> Problem:
    return Problem(
        "unreachable",
        f"{ctx.where} accepted the connection but sent no CONNACK within {timeout:g} s; check "
        f"that {ctx.option} names an MQTT listener (a TLS listener needs mqtts://)",
    )


def closed_before_connack(ctx: Context) -> Problem:
    return Problem(
        "refused",
        f"{ctx.where} closed the connection without answering CONNECT; check that {ctx.option} "
        "names an MQTT listener, and the broker's log for why it refused this client",
    )


def _prefix(topic: str) -> str:
    return topic.rsplit("/", 2)[0] if topic.count("/") >= 2 else topic


def publish_refused(topic: str, code: int, name: str, ctx: Context) -> str:
    """A PUBACK with a failure reason: the broker will not take this topic from us."""
    if code == TOPIC_NAME_INVALID:
        fix = "choose a --topic-prefix of letters, digits, '-' and '_'"
    else:
        fix = (
            f"allow {ctx.account} to write {_prefix(topic)}/# in the broker's ACL, or change "
            "--topic-prefix"
        )
    return f"{ctx.where} refused to take {topic!r} from {ctx.account} ({name}): {fix}"


def subscribe_refused(topic: str, name: str, ctx: Context) -> str:
    """A SUBACK with a failure code: nothing will arrive on this topic."""
    prefix = _prefix(topic)
    return (
        f"{ctx.where} refused the subscription to {topic!r} for {ctx.account} ({name}): allow "
        f"it to read {prefix}/+/changes and {prefix}/+/head in the broker's ACL, or fix "
        "--topic-prefix"
    )


def closed_after_publish(topic: str, ctx: Context) -> str:
    """MQTT 3.1.1 has no PUBACK reason codes: a broker refuses a PUBLISH by disconnecting."""
    return (
        f"{ctx.where} closed the connection after a PUBLISH on {topic!r} without acknowledging "
        "any: on MQTT 3.1.1 that is how a broker refuses a topic or a payload (NATS refuses "
        "'.' and spaces in topics); check --topic-prefix, the account's ACL and the broker's log"
    )
