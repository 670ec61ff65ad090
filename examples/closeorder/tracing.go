package main

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracerProvider builds the -trace choice. The returned func flushes and
// stops it.
func tracerProvider(ctx context.Context, mode string) (trace.TracerProvider, func(context.Context) error, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch mode {
	case "none":
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	case "stdout":
		exp, err = stdouttrace.New(stdouttrace.WithWriter(os.Stderr))
	case "otlp":
		// Endpoint, headers and protocol come from the standard
		// OTEL_EXPORTER_OTLP_* variables.
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, nil, fmt.Errorf("unknown tracing %q", mode)
	}
	if err != nil {
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	return tp, tp.Shutdown, nil
}
