"""Server interceptors (error mapping, auth, tracing) and client interceptors (auth, trace context).

Passed explicitly to servers and channels; nothing is patched globally. Each
server interceptor wraps the behaviour of the real handler, so unary and
streaming handlers (generator functions included) are covered alike, and
errors raised mid-stream are mapped too.
"""

from __future__ import annotations

import collections
import hmac
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from ferryman.config import RpcConfig
from ferryman.rpc._errors import abort_with

Behavior = Callable[[Any, grpc.ServicerContext], Any]
#: Wraps one handler behaviour; the flag says whether it returns a response stream.
Wrap = Callable[[Behavior, bool, str], Behavior]

#: Calls that stay open without a token, so orchestrators can probe health and
#: tools can discover services; neither reveals data.
OPEN_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def _rewrap(handler: grpc.RpcMethodHandler[Any, Any], method: str, wrap: Wrap) -> grpc.RpcMethodHandler[Any, Any]:
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            wrap(handler.unary_unary, False, method), handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            wrap(handler.unary_stream, True, method), handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            wrap(handler.stream_unary, False, method), handler.request_deserializer, handler.response_serializer
        )
    assert handler.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(
        wrap(handler.stream_stream, True, method), handler.request_deserializer, handler.response_serializer
    )


class _WrappingInterceptor(grpc.ServerInterceptor):
    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return _rewrap(handler, handler_call_details.method, self.wrap)

    def wrap(self, behavior: Behavior, streaming: bool, method: str) -> Behavior:
        raise NotImplementedError  # every subclass defines it


def _code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    """The status code a handler set (the stubs do not declare ServicerContext.code)."""
    code_fn: Callable[[], grpc.StatusCode | None] = getattr(context, "code")  # noqa: B009
    return code_fn()


def _already_aborted(context: grpc.ServicerContext) -> bool:
    code = _code(context)
    return code is not None and code != grpc.StatusCode.OK


class ErrorMappingInterceptor(_WrappingInterceptor):
    """Ferryman errors to precise status codes with ErrorInfo; anything else to INTERNAL, never UNKNOWN."""

    def wrap(self, behavior: Behavior, streaming: bool, method: str) -> Behavior:
        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from behavior(request, context)
                except Exception as exc:
                    if _already_aborted(context):
                        raise
                    abort_with(context, exc)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                return behavior(request, context)
            except Exception as exc:
                if _already_aborted(context):
                    raise
                abort_with(context, exc)

        return unary


class AuthInterceptor(_WrappingInterceptor):
    """Requires ``authorization: Bearer <token>``; health and reflection stay open."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, context: grpc.ServicerContext) -> bool:
        for key, value in context.invocation_metadata():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False

    def wrap(self, behavior: Behavior, streaming: bool, method: str) -> Behavior:
        if method.startswith(OPEN_METHOD_PREFIXES):
            return behavior
        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                if not self._allowed(context):
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
                yield from behavior(request, context)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            if not self._allowed(context):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            return behavior(request, context)

        return unary


class TracingInterceptor(_WrappingInterceptor):
    """One SERVER span per RPC, parented on the caller's W3C trace context."""

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("ferryman.rpc", tracer_provider=tracer_provider)

    def wrap(self, behavior: Behavior, streaming: bool, method: str) -> Behavior:
        service, _, name = method.lstrip("/").rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        def start(context: grpc.ServicerContext) -> trace.Span:
            carrier = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            parent = propagate.extract(carrier)
            return self._tracer.start_span(
                method.lstrip("/"), context=parent, kind=SpanKind.SERVER, attributes=attributes
            )

        def finish(span: trace.Span, context: grpc.ServicerContext, exc: BaseException | None) -> None:
            code = _code(context) or (grpc.StatusCode.OK if exc is None else grpc.StatusCode.INTERNAL)
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code != grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, code.name))
            span.end()

        if streaming:

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                span = start(context)
                exc: BaseException | None = None
                try:
                    with trace.use_span(span, end_on_exit=False):
                        yield from behavior(request, context)
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(span, context, exc)

            return stream

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            span = start(context)
            exc: BaseException | None = None
            try:
                with trace.use_span(span, end_on_exit=False):
                    return behavior(request, context)
            except BaseException as e:
                exc = e
                raise
            finally:
                finish(span, context, exc)

        return unary


def default_server_interceptors(
    rpc: RpcConfig, *, tracer_provider: TracerProvider | None = None
) -> list[grpc.ServerInterceptor]:
    """Tracing (outermost, so it sees every outcome), auth if a token is set, error mapping (innermost)."""
    out: list[grpc.ServerInterceptor] = [TracingInterceptor(tracer_provider)]
    if rpc.auth_token is not None:
        out.append(AuthInterceptor(rpc.auth_token.get_secret_value()))
    out.append(ErrorMappingInterceptor())
    return out


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class ClientMetadataInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token (if any) and the current W3C trace context to every call."""

    def __init__(self, token: str | None) -> None:
        self._token = token

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata: list[tuple[str, str | bytes]] = list(details.metadata or [])
        if self._token is not None:
            metadata.append(("authorization", f"Bearer {self._token}"))
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        metadata.extend(carrier.items())
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

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


def client_interceptors(rpc: RpcConfig) -> Sequence[ClientMetadataInterceptor]:
    """Interceptors every Ferryman channel uses."""
    token = rpc.auth_token.get_secret_value() if rpc.auth_token is not None else None
    return [ClientMetadataInterceptor(token)]
