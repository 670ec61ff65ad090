package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// meterProvider collects the service's metrics (warden's locks,
// idempotency and scheduler, and Go's runtime) for Prometheus to scrape at
// /metrics. The registry is the service's own, so that nothing else
// registered in the process leaks into the page.
func meterProvider() (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, err
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
