package scheduler

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

const instrumentation = "github.com/warden-go/warden/scheduler"

type telemetry struct {
	tracer   trace.Tracer
	runs     metric.Int64Counter
	overruns metric.Int64Counter
	duration metric.Float64Histogram
	lag      metric.Float64Histogram
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) (*telemetry, error) {
	m := mp.Meter(instrumentation)
	t := &telemetry{tracer: tp.Tracer(instrumentation)}
	var err error
	if t.runs, err = m.Int64Counter("warden.scheduler.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Job runs, by job and outcome (ran, skipped, failed, lost, misfired).")); err != nil {
		return nil, err
	}
	if t.overruns, err = m.Int64Counter("warden.scheduler.overruns", metric.WithUnit("{run}"),
		metric.WithDescription("Runs still going past LockAtMostFor, by job.")); err != nil {
		return nil, err
	}
	if t.duration, err = m.Float64Histogram("warden.scheduler.run.duration", metric.WithUnit("s"),
		metric.WithDescription("How long jobs that started ran.")); err != nil {
		return nil, err
	}
	if t.lag, err = m.Float64Histogram("warden.scheduler.lag", metric.WithUnit("s"),
		metric.WithDescription("Delay between a run's slot and its start, on the scheduler's clock.")); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *telemetry) start(ctx context.Context, rec *RunRecord) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "warden.scheduler.run", trace.WithAttributes(
		attribute.String("warden.job", rec.Job),
		attribute.String("warden.slot", rec.Slot.UTC().Format("2006-01-02T15:04:05.999999999Z07:00")),
		attribute.String("warden.instance", rec.Instance),
	))
}

func (t *telemetry) end(ctx context.Context, span trace.Span, rec *RunRecord) {
	job := attribute.String("warden.job", rec.Job)
	outcome := attribute.String("warden.outcome", string(rec.Outcome))
	t.runs.Add(ctx, 1, metric.WithAttributes(job, outcome))
	t.lag.Record(ctx, rec.Started.Sub(rec.Slot).Seconds(), metric.WithAttributes(job))
	if rec.Outcome == Ran || rec.Outcome == Failed || rec.Outcome == Lost {
		t.duration.Record(ctx, rec.Finished.Sub(rec.Started).Seconds(), metric.WithAttributes(job, outcome))
	}
	span.SetAttributes(outcome, attribute.Int64("warden.token", int64(rec.Token)))
	if rec.Reason != "" {
		span.SetAttributes(attribute.String("warden.reason", rec.Reason))
	}
	if rec.Err != nil {
		span.RecordError(rec.Err)
		span.SetStatus(codes.Error, string(rec.Outcome))
	}
	span.End()
}
