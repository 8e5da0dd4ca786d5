"""Server interceptors (error mapping, auth, tracing) and the client interceptor (token, trace context).

All of them are passed explicitly to a server or a channel; nothing is patched
globally. The server interceptors wrap the *behaviour* of the real handler, so
unary handlers and streaming handlers written as generator functions are
covered alike, errors raised between two ``yield`` s included.

Facts of the sync gRPC server that shape this module:

* A streaming handler is a generator; the server calls it, then pulls
  responses with ``next()`` on a worker thread. An exception raised inside
  ``next()`` becomes ``UNKNOWN`` ("Exception iterating responses") unless the
  handler aborted first, which is why error mapping wraps the generator rather
  than the call that creates it.
* When the client goes away (cancel, deadline, network) the server just stops
  pulling and drops the generator; it never calls ``close()``, and a handler
  busy elsewhere is not told at all. The tracing interceptor therefore also
  ends its span from ``context.add_callback`` and never leaves its
  OpenTelemetry context attached across a ``yield``.
* A handler reading the request stream may see a cancelled call as a clean
  end of that stream, before ``context.is_active()`` turns false. Such a
  span can then record OK for a call the client saw CANCELLED.
* Callback-style handlers (``experimental_non_blocking``, i.e. the health
  service's Watch) take a third argument and return nothing; they are passed
  through unwrapped (auth still applies; Watch is open anyway).
"""

from __future__ import annotations

import abc
import hmac
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from ferryman.config import ApiToken, RpcConfig, SecretStr, TokenRole
from ferryman.errors import ConfigError
from ferryman.rpc._errors import ERROR_DOMAIN, abort_with, status_code_for
from ferryman.rpc._roles import ALL_ROLES, grants, is_open, required_role

_log = logging.getLogger(__name__)

_Behavior = Callable[..., Any]
_Continuation = Callable[[grpc.HandlerCallDetails], "grpc.RpcMethodHandler[Any, Any] | None"]

#: Codes that mark a SERVER span as failed (OpenTelemetry RPC semantic
#: conventions): the server's fault, not the caller's.
_SERVER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


# -- server side: plumbing ---------------------------------------------------------------------------------------


def _copy_thread_pool(behavior: _Behavior, wrapped: _Behavior) -> _Behavior:
    # gRPC runs a behaviour on its own pool when it carries this attribute; keep it.
    pool = getattr(behavior, "experimental_thread_pool", None)
    if pool is not None:
        setattr(wrapped, "experimental_thread_pool", pool)  # noqa: B010 (not declared on Callable)
    return wrapped


def _rewrap(
    handler: grpc.RpcMethodHandler[Any, Any],
    unary: Callable[[_Behavior], _Behavior],
    stream: Callable[[_Behavior], _Behavior],
) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler with its behaviour wrapped by unary (one response) or stream (a response iterator)."""
    des, ser = handler.request_deserializer, handler.response_serializer
    behavior: _Behavior | None = (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )
    if behavior is None or getattr(behavior, "experimental_non_blocking", False):
        # Callback-style handlers (the health service's Watch) take a third
        # argument and return nothing to wrap; they pass through untouched.
        return handler
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_copy_thread_pool(behavior, unary(behavior)), des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_copy_thread_pool(behavior, stream(behavior)), des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_copy_thread_pool(behavior, unary(behavior)), des, ser)
    return grpc.stream_stream_rpc_method_handler(_copy_thread_pool(behavior, stream(behavior)), des, ser)


class _BehaviorInterceptor(grpc.ServerInterceptor, abc.ABC):
    """Base of interceptors that wrap what a handler does (not only whether it runs)."""

    def intercept_service(
        self, continuation: _Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the behaviour of the handler found further down the chain."""
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        return _rewrap(handler, lambda b: self._wrap_unary(b, method), lambda b: self._wrap_stream(b, method))

    @abc.abstractmethod
    def _wrap_unary(self, behavior: _Behavior, method: str) -> _Behavior:
        """Wrap a behaviour returning one response."""

    @abc.abstractmethod
    def _wrap_stream(self, behavior: _Behavior, method: str) -> _Behavior:
        """Wrap a behaviour returning a response iterator; the wrapper must be a generator."""


def _set_code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    """The code the handler set (``abort``, ``set_code``), if any.

    ``code()`` is the sync server's accessor; the type stubs do not declare it.
    """
    code = getattr(context, "code", None)
    result: grpc.StatusCode | None = code() if callable(code) else None
    return result


def _settled(context: grpc.ServicerContext) -> bool:
    """True when the outcome is decided already: the handler aborted or set a code, or the client is gone."""
    code = _set_code(context)
    return (code is not None and code is not grpc.StatusCode.OK) or not context.is_active()


def _gone_code(context: grpc.ServicerContext) -> grpc.StatusCode:
    """Best account of a call that ended without its handler finishing."""
    code = _set_code(context)
    if code is not None and code is not grpc.StatusCode.OK:
        return code
    if context.time_remaining() <= 0:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


# -- server side: error mapping ----------------------------------------------------------------------------------


def _report(context: grpc.ServicerContext, exc: Exception, method: str) -> NoReturn:
    code = status_code_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        _log.error("%s failed unexpectedly; the client gets INTERNAL", method, exc_info=exc)
    else:
        _log.warning("%s failed with %s: %s", method, code.name, exc)
    abort_with(context, exc)


class ErrorMappingInterceptor(_BehaviorInterceptor):
    """Turns exceptions into precise status codes with a ``google.rpc.ErrorInfo`` detail.

    Ferryman errors map per `status_code_for`; any other exception becomes
    ``INTERNAL`` with its message (the traceback is logged here, never sent),
    so no handler error reaches a client as ``UNKNOWN``. Calls whose outcome is
    already decided (the handler called ``context.abort`` or ``set_code``, or
    the client went away) pass through untouched.
    """

    def _wrap_unary(self, behavior: _Behavior, method: str) -> _Behavior:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return behavior(request, context)
            except Exception as exc:
                if _settled(context):
                    raise
                _report(context, exc, method)

        return handle

    def _wrap_stream(self, behavior: _Behavior, method: str) -> _Behavior:
        def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from behavior(request, context)
            except Exception as exc:
                if _settled(context):
                    raise
                _report(context, exc, method)

        return handle


# -- server side: auth -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Credential:
    name: str
    secret: bytes
    roles: frozenset[TokenRole]


def _refusal(code: grpc.StatusCode, message: str, reason: str, metadata: Mapping[str, str]) -> grpc.Status:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=dict(metadata)))
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[detail]))


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks ``authorization: Bearer <token>`` metadata and the role the method needs.

    No token, or one the server does not know: UNAUTHENTICATED (``ErrorInfo`` reason
    ``MISSING_TOKEN``, ``MALFORMED_TOKEN`` or ``INVALID_TOKEN``). A known token whose
    role does not cover the method (`required_role`): PERMISSION_DENIED (reason
    ``ROLE_NOT_ALLOWED``, metadata ``method``, ``required_role``, ``token_role`` and
    ``token``, the token's name, never its secret). Health checking and server
    reflection stay open (`OPEN_METHOD_PREFIXES`). Tokens are compared in constant
    time, each against every known one. A refused call never reaches its handler
    (nor the interceptors after this one).
    """

    def __init__(self, token: str | SecretStr | None = None, tokens: Mapping[str, ApiToken] | None = None) -> None:
        """Accept token (every role; ``rpc.auth_token``) and the named tokens (their own role).

        Raises:
            ConfigError: a secret is empty, or no token at all is given.
        """
        credentials: list[_Credential] = []
        if token is not None:
            secret = token.get_secret_value() if isinstance(token, SecretStr) else token
            if not secret:
                raise ConfigError("rpc.auth_token must not be empty (leave it unset to disable auth)")
            credentials.append(_Credential("auth_token", secret.encode(), ALL_ROLES))
        for name, api_token in (tokens or {}).items():
            secret = api_token.secret.get_secret_value()
            if not secret:
                raise ConfigError(f"rpc.tokens.{name}.secret must not be empty")
            credentials.append(_Credential(name, secret.encode(), grants(api_token.role)))
        if not credentials:
            raise ConfigError("token auth needs rpc.auth_token or rpc.tokens")
        self._credentials = tuple(credentials)

    def intercept_service(
        self, continuation: _Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Continue down the chain if the call is open or its token may make it; refuse it otherwise."""
        method = handler_call_details.method
        if is_open(method):
            return continuation(handler_call_details)
        refusal = self._refusal(method, handler_call_details.invocation_metadata or ())
        if refusal is None:
            return continuation(handler_call_details)
        _log.warning("refused %s: %s", method, refusal.details)

        def refuse(request: Any, context: grpc.ServicerContext) -> NoReturn:
            context.abort_with_status(refusal)
            raise AssertionError("abort_with_status returned")  # it raises; this satisfies NoReturn

        # Stream-stream whatever the method's shape: the server then reads
        # nothing before the handler runs, and the wire is the same for all shapes.
        return grpc.stream_stream_rpc_method_handler(refuse)

    def _refusal(self, method: str, metadata: Sequence[tuple[str, str | bytes]]) -> grpc.Status | None:
        unauthenticated = grpc.StatusCode.UNAUTHENTICATED
        about = {"method": method}
        for key, value in metadata:
            if key != "authorization":
                continue
            if isinstance(value, bytes):
                return _refusal(unauthenticated, "malformed authorization metadata", "MALFORMED_TOKEN", about)
            scheme, _, given = value.strip().partition(" ")
            if scheme.lower() != "bearer":
                message = "authorization metadata must use the Bearer scheme"
                return _refusal(unauthenticated, message, "MALFORMED_TOKEN", about)
            credential = self._match(given.strip().encode())
            if credential is None:
                return _refusal(unauthenticated, "invalid bearer token", "INVALID_TOKEN", about)
            needed = required_role(method)
            if needed in credential.roles:
                return None
            held = "admin" if "admin" in credential.roles else ",".join(sorted(credential.roles))
            message = f"{method} needs the {needed} role; token {credential.name!r} has {held}"
            metadata_out = {**about, "required_role": needed, "token_role": held, "token": credential.name}
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, message, "ROLE_NOT_ALLOWED", metadata_out)
        message = "missing bearer token (authorization metadata)"
        return _refusal(unauthenticated, message, "MISSING_TOKEN", about)

    def _match(self, given: bytes) -> _Credential | None:
        found = None
        for credential in self._credentials:  # every one compared: the time does not tell which matched
            if hmac.compare_digest(given, credential.secret):
                found = credential
        return found


# -- server side: tracing ----------------------------------------------------------------------------------------


class _ServerSpan:
    """The SERVER span of one call, ended exactly once whichever way the call ends."""

    def __init__(self, span: Span, context: grpc.ServicerContext) -> None:
        self._span = span
        self._context = context
        self._lock = threading.Lock()
        self._ended = False
        # The client can go away while the handler blocks, or between two
        # responses; gRPC then drops the handler without telling it, but always
        # runs the call's callbacks (on its polling thread).
        if not context.add_callback(self.abandon):
            self.abandon()

    @contextmanager
    def active(self) -> Iterator[None]:
        """Make the span current while handler code runs (never across a ``yield``)."""
        with trace.use_span(self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield

    def succeed(self) -> None:
        """The handler returned (it may still have set a code)."""
        if not self._context.is_active():
            # A cancelled client can look like a clean end of the request
            # stream to the handler, which then returns normally.
            self._end(_gone_code(self._context), None)
        else:
            self._end(_set_code(self._context) or grpc.StatusCode.OK, None)

    def fail(self, exc: BaseException) -> None:
        """The handler raised exc; record the code the client will get."""
        code = _set_code(self._context)
        if code is not None and code is not grpc.StatusCode.OK:
            self._end(code, None)  # context.abort(): its exception is gRPC's signal, not an error of ours
        elif not self._context.is_active():
            self._end(_gone_code(self._context), None)
        else:
            self._end(status_code_for(exc), exc)

    def abandon(self) -> None:
        """The call ended without the handler finishing (no-op if it finished)."""
        self._end(_gone_code(self._context), None)

    def _end(self, code: grpc.StatusCode, exc: BaseException | None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._span.set_attribute("rpc.grpc.status_code", code.value[0])
        if exc is not None:
            self._span.record_exception(exc)
        if code in _SERVER_ERROR_CODES:
            self._span.set_status(Status(StatusCode.ERROR, code.name))
        self._span.end()


class TracingInterceptor(_BehaviorInterceptor):
    """One SERVER span per call, child of the caller's W3C trace context.

    The parent comes from the call's metadata (``traceparent``, via the
    globally configured propagator). Attributes: ``rpc.system``,
    ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``. A streaming
    call's span ends when the stream ends, however it ends. The code recorded
    for an exception is the one `ErrorMappingInterceptor` sends, so this
    interceptor belongs *inside* that one (see `default_server_interceptors`).
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("ferryman.rpc", tracer_provider=tracer_provider)

    def _start(self, method: str, context: grpc.ServicerContext) -> _ServerSpan:
        service, _, name = method.lstrip("/").rpartition("/")
        carrier = {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}
        span = self._tracer.start_span(
            f"{service}/{name}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        return _ServerSpan(span, context)

    def _wrap_unary(self, behavior: _Behavior, method: str) -> _Behavior:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            call = self._start(method, context)
            try:
                with call.active():
                    response = behavior(request, context)
            except BaseException as exc:
                call.fail(exc)
                raise
            call.succeed()
            return response

        return handle

    def _wrap_stream(self, behavior: _Behavior, method: str) -> _Behavior:
        def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            call = self._start(method, context)
            responses: Iterator[Any] | None = None
            try:
                with call.active():
                    responses = iter(behavior(request, context))
                while True:
                    with call.active():
                        try:
                            response = next(responses)
                        except StopIteration:
                            break
                    yield response
            except GeneratorExit:
                # Closed by whoever dropped the stream (gRPC itself never closes it).
                close = getattr(responses, "close", None)
                if close is not None:
                    with call.active():
                        close()
                call.abandon()
                raise
            except BaseException as exc:
                call.fail(exc)
                raise
            call.succeed()

        return handle


def default_server_interceptors(
    rpc: RpcConfig, *, tracer_provider: TracerProvider | None = None
) -> list[grpc.ServerInterceptor]:
    """The interceptors every Ferryman server uses, outermost first.

    1. error mapping: outermost, so that nothing, not even a fault in another
       interceptor, reaches a client as ``UNKNOWN``;
    2. auth, only when ``rpc.auth_token`` or ``rpc.tokens`` is set: before tracing, so an
       unauthenticated caller neither creates spans nor picks their parent;
    3. tracing: around the handler itself.

    Args:
        rpc: Shared gRPC settings (the tokens).
        tracer_provider: Where spans go; the global provider when None.
    """
    interceptors: list[grpc.ServerInterceptor] = [ErrorMappingInterceptor()]
    if rpc.auth_enabled:
        interceptors.append(AuthInterceptor(rpc.auth_token, rpc.tokens))
    interceptors.append(TracingInterceptor(tracer_provider))
    return interceptors


# -- client side -------------------------------------------------------------------------------------------------


class _CallDetails(grpc.ClientCallDetails):
    def __init__(
        self,
        details: grpc.ClientCallDetails,
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class ClientMetadataInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token (if any) and the current W3C trace context to every call.

    Metadata rather than ``grpc.access_token_call_credentials``: gRPC refuses
    call credentials on insecure channels, and the token must work on both.
    """

    def __init__(self, token: str | None) -> None:
        self._authorization = f"Bearer {token}" if token else None

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata: list[tuple[str, str | bytes]] = list(details.metadata or ())
        if self._authorization is not None:
            metadata.append(("authorization", self._authorization))
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        metadata.extend(carrier.items())
        return _CallDetails(details, tuple(metadata))

    def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        """Unary call."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        """Server-streaming call."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request_iterator: Any
    ) -> Any:
        """Client-streaming call."""
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: grpc.ClientCallDetails, request_iterator: Any
    ) -> Any:
        """Bidirectional call."""
        return continuation(self._details(client_call_details), request_iterator)


def client_interceptor(rpc: RpcConfig) -> ClientMetadataInterceptor:
    """The interceptor every Ferryman channel uses."""
    token = rpc.auth_token.get_secret_value() if rpc.auth_token is not None else None
    return ClientMetadataInterceptor(token)
