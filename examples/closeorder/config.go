package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard/driver"
)

// config is the command line, validated.
type config struct {
	addr        string
	adminAddr   string
	readTimeout time.Duration
	db          string
	lock        string
	idempotency string
	schedule    string
	unpaidAfter time.Duration
	workDelay   time.Duration
	ttl         time.Duration
	instance    string
	trace       string
}

// usageError is a bad flag: the message names it, the exit status is 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badFlag(name, format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf("-%s: %s", name, fmt.Sprintf(format, args...))}
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	host, _ := os.Hostname()
	c := &config{}
	fs := flag.NewFlagSet("closeorder", flag.ContinueOnError)
	// A flag the parser refuses is told in one line, as every bad flag is,
	// not followed by the usage; -h prints the usage.
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen address of the API")
	fs.StringVar(&c.adminAddr, "admin-addr", "127.0.0.1:8081", "listen address of the operator endpoints (debug page, metrics, job runs); keep it off public networks; empty: none")
	fs.DurationVar(&c.readTimeout, "read-timeout", 10*time.Second, "bound on reading one request, headers and body")
	fs.StringVar(&c.db, "db", "sqlite://closeorder.db", "orders database: sqlite://PATH | postgres://... | mysql://user:pass@tcp(host:port)/db")
	fs.StringVar(&c.lock, "lock", "", "lock backend: memory | sqlite://PATH | postgres://... | mysql://... | redis://[user:pass@]host:port[/db] | rediss://... (TLS) | redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db] | redlocks://... | etcd://[user:pass@]host:port[,...] | zk://host:port[,...] | consul://host:port (default: same as -db)")
	fs.StringVar(&c.idempotency, "idempotency", "", "idempotency store, same URL forms (default: the -lock backend where it has a store, else -db)")
	fs.StringVar(&c.schedule, "schedule", "@every 1m", "cron spec of the close job (5 fields, 6 with seconds, or descriptors such as @every 1s)")
	fs.DurationVar(&c.unpaidAfter, "unpaid-after", 30*time.Minute, "close orders unpaid for longer than this")
	fs.DurationVar(&c.workDelay, "work-delay", 0, "pause per order inside the close job (demos and fault tests)")
	fs.DurationVar(&c.ttl, "ttl", 15*time.Second, "lock lease ttl")
	fs.StringVar(&c.instance, "instance", fmt.Sprintf("%s-%d", host, os.Getpid()), "replica name")
	fs.StringVar(&c.trace, "trace", "none", "tracing: none | stdout | otlp (OTLP from the OTEL_EXPORTER_OTLP_* variables)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fs.Usage()
			return nil, err
		}
		return nil, &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if c.lock == "" {
		c.lock = c.db
	}
	return c, c.validate()
}

func (c *config) validate() error {
	if _, _, err := net.SplitHostPort(c.addr); err != nil {
		return badFlag("addr", "%q is not host:port", c.addr)
	}
	if _, _, err := net.SplitHostPort(c.adminAddr); err != nil && c.adminAddr != "" {
		return badFlag("admin-addr", "%q is not host:port", c.adminAddr)
	}
	if c.readTimeout <= 0 {
		return badFlag("read-timeout", "%v is not positive", c.readTimeout)
	}
	for _, f := range []struct{ name, value string }{{"db", c.db}, {"lock", c.lock}, {"idempotency", c.idempotency}} {
		if f.value == "" && f.name == "idempotency" {
			continue
		}
		u, err := backendurl.Parse(f.value)
		if err != nil {
			return badFlag(f.name, "%v", err)
		}
		if f.name == "db" && !u.SQL() {
			return badFlag("db", "%s: the orders database must be sqlite://, postgres:// or mysql://", u)
		}
	}
	parser := cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
	if _, err := parser.Parse(c.schedule); err != nil {
		return badFlag("schedule", "%q: %v", c.schedule, err)
	}
	if c.unpaidAfter < 0 {
		return badFlag("unpaid-after", "%v is negative", c.unpaidAfter)
	}
	if c.workDelay < 0 {
		return badFlag("work-delay", "%v is negative", c.workDelay)
	}
	if c.ttl < time.Second {
		return badFlag("ttl", "%v is below 1s", c.ttl)
	}
	if c.instance == "" || len(c.instance) > 128 {
		return badFlag("instance", "must be 1 to 128 characters")
	}
	// The instance also labels the locks it holds (guard.WithOwner), as
	// operators see them in the CLI and on the debug page.
	if err := driver.CheckOwner(c.instance); err != nil {
		return badFlag("instance", "%v", err)
	}
	switch c.trace {
	case "none", "stdout", "otlp":
	default:
		return badFlag("trace", "%q: want none, stdout or otlp", c.trace)
	}
	return nil
}
