// Command closeorder is warden's example service: orders that are closed by a
// cron job when left unpaid too long, with the job running on one replica of
// a cluster at a time and once per scheduled slot, and order endpoints made
// idempotent per user.
//
//	go run ./examples/closeorder                   # SQLite file, nothing else needed
//	go run ./examples/closeorder -lock redis://127.0.0.1:6379 -schedule '@every 1s'
//
// See README.md beside this file for the HTTP API and `make demo`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/debugpage"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/httpmw"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/scheduler"
)

const closeJob = "close-unpaid-orders"

// migrateLock is the lock the replicas migrate the orders database under.
const migrateLock = "migrate"

func main() {
	// go-redis prints each failed dial of its pool to stderr, outside the
	// service's log; what fails is reported once, by the error it causes.
	goredis.SetLogger(quietRedis{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program; it returns the exit status: 0 after a clean
// shutdown, 2 for a bad flag or an unreachable backend, 1 for other failures.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "closeorder: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("instance", cfg.instance)
	app, err := open(ctx, cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "closeorder: %v\n", err)
		var u *unreachable
		var bad *usageError
		if errors.As(err, &u) || errors.As(err, &bad) {
			return 2
		}
		return 1
	}
	defer app.close()
	if err := app.serve(ctx, stdout); err != nil {
		fmt.Fprintf(stderr, "closeorder: %v\n", err)
		return 1
	}
	return 0
}

// app is the running service.
type app struct {
	cfg      *config
	log      *slog.Logger
	backends *backendurl.Opener
	orders   *orders
	sched    *scheduler.Scheduler
	handler  http.Handler                // the API
	admin    http.Handler                // the operator endpoints
	shutdown func(context.Context) error // tracing
}

// migrate migrates the orders database under the lock migrateLock. The
// replicas of a new deployment start together, and each creates the
// tables it finds missing: one at a time, or all but one fail on a table
// another has just created. A replica waits for the lock for as long as
// the one holding it migrates, however long that takes, or until it is
// told to stop: a replica that died migrating lets the lock go one -ttl
// later. A replica that finds the lock held says who holds it before it
// waits, so that a deploy stuck behind a migration that hangs tells its
// operator why. A failure names the flag of the backend that failed.
func (a *app) migrate(ctx context.Context, g *guard.Guard, dbURL, lockURL *backendurl.URL) error {
	if in, err := g.Inspect(ctx, migrateLock); err == nil && len(in.Holders) > 0 {
		h := in.Holders[0]
		a.log.Info("waiting for the replica that holds the lock to migrate the orders database",
			"lock", migrateLock, "holder", h.Owner, "token", h.Token)
	}
	var migrated error
	err := g.Do(ctx, migrateLock, func(ctx context.Context, _ *guard.Lock) error {
		migrated = a.orders.migrate(ctx)
		return migrated
	})
	switch {
	case migrated != nil:
		return fmt.Errorf("-db %s: migrating: %w", dbURL, dbURL.RedactError(err))
	case err != nil:
		return fmt.Errorf("-lock %s: taking the lock %q to migrate the orders database: %w", lockURL, migrateLock, lockURL.RedactError(err))
	}
	return nil
}

func open(ctx context.Context, cfg *config, log *slog.Logger) (*app, error) {
	a := &app{cfg: cfg, log: log, backends: backendurl.NewOpener()}
	ok := false
	defer func() {
		if !ok {
			a.close()
		}
	}()
	dbURL, _ := backendurl.Parse(cfg.db)
	db, err := a.backends.SQL(ctx, dbURL)
	if err != nil {
		return nil, &unreachable{"db", dbURL, err}
	}
	a.orders = &orders{db: db}

	lockURL, _ := backendurl.Parse(cfg.lock)
	locker, err := a.backends.Locker(ctx, lockURL, cfg.ttl)
	if err != nil {
		return nil, &unreachable{"lock", lockURL, err}
	}
	store, err := a.openStore(ctx, lockURL, dbURL)
	if err != nil {
		return nil, err
	}

	tp, shutdown, err := tracerProvider(ctx, cfg.trace)
	if err != nil {
		return nil, badFlag("trace", "%v", err)
	}
	a.shutdown = shutdown
	mp, metrics, err := meterProvider()
	if err != nil {
		return nil, err
	}
	g, err := guard.New(locker, guard.WithTTL(cfg.ttl), guard.WithPrefix("closeorder:"), guard.WithOwner(cfg.instance),
		guard.WithBackendName(lockURL.Scheme), guard.WithLogger(log), guard.WithTracerProvider(tp), guard.WithMeterProvider(mp))
	if errors.Is(err, guard.ErrInvalidOption) {
		// The one option here a user chooses: a TTL the backend does not
		// honour (Consul's 10 s minimum, etcd's whole seconds).
		return nil, badFlag("ttl", "%v", err)
	}
	if err != nil {
		return nil, err
	}
	if err := a.migrate(ctx, g, dbURL, lockURL); err != nil {
		return nil, err
	}

	a.sched, err = scheduler.New(g,
		scheduler.WithSlotStore(store),
		scheduler.WithInstance(cfg.instance),
		scheduler.WithLogger(log),
		scheduler.WithTracerProvider(tp),
		scheduler.WithRunObserver(a.recordRun),
	)
	if err != nil {
		return nil, err
	}
	if err := a.sched.Add(cfg.schedule, closeJob, a.closeUnpaid); err != nil {
		return nil, badFlag("schedule", "%v", err)
	}

	idem, err := httpmw.Idempotency(store,
		httpmw.WithRequireKey(),
		httpmw.WithScope(func(r *http.Request) string { return userFrom(r.Context()) }),
		httpmw.WithLogger(log),
		httpmw.WithTracerProvider(tp),
		httpmw.WithMeterProvider(mp),
	)
	if err != nil {
		return nil, err
	}
	page, err := debugpage.New(g, debugpage.WithScheduler(a.sched), debugpage.WithStore(store))
	if err != nil {
		return nil, err
	}
	srv := &server{orders: a.orders, log: log, idempotent: idem, failing: a.failing, debug: page, metrics: metrics}
	a.handler, a.admin = srv.routes(), srv.adminRoutes()
	ok = true
	return a, nil
}

// openStore opens the idempotency store: -idempotency when given, else the
// lock backend's own store where it has one, else the orders database's.
func (a *app) openStore(ctx context.Context, lockURL, dbURL *backendurl.URL) (idempotency.Store, error) {
	flagName, u := "idempotency", lockURL
	if a.cfg.idempotency != "" {
		u, _ = backendurl.Parse(a.cfg.idempotency)
	}
	store, err := a.backends.Store(ctx, u)
	if errors.Is(err, backendurl.ErrNoStore) && a.cfg.idempotency == "" {
		flagName, u = "db", dbURL
		store, err = a.backends.Store(ctx, u)
	}
	if errors.Is(err, backendurl.ErrNoStore) {
		return nil, badFlag(flagName, "%v", err)
	}
	if err != nil {
		return nil, &unreachable{flagName, u, err}
	}
	return store, nil
}

// failing names the backends that do not answer, and logs why.
func (a *app) failing(ctx context.Context) []string {
	var names []string
	for _, ping := range a.backends.Pings() {
		if err := ping.Check(ctx); err != nil {
			a.log.WarnContext(ctx, "health check", "backend", ping.Backend, "error", err)
			if !slices.Contains(names, ping.Backend) {
				names = append(names, ping.Backend)
			}
		}
	}
	return names
}

func (a *app) close() {
	if a.shutdown != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a.shutdown(ctx)
		cancel()
	}
	a.backends.Close()
}

// serve runs the HTTP servers and the scheduler until ctx is done, then
// stops them, letting a running job finish (bounded) and release its lock.
func (a *app) serve(ctx context.Context, stdout io.Writer) error {
	ln, err := net.Listen("tcp", a.cfg.addr)
	if err != nil {
		return badFlag("addr", "%v", err)
	}
	servers := []*http.Server{a.httpServer(a.handler)}
	listeners := []net.Listener{ln}
	admin := "off (-admin-addr is empty)"
	if a.cfg.adminAddr != "" {
		aln, err := net.Listen("tcp", a.cfg.adminAddr)
		if err != nil {
			ln.Close()
			return badFlag("admin-addr", "%v", err)
		}
		servers, listeners = append(servers, a.httpServer(a.admin)), append(listeners, aln)
		admin = fmt.Sprintf("on http://%s (debug page /debug/warden, metrics /metrics, job runs /jobs/runs)", aln.Addr())
	}
	served := make(chan error, len(servers))
	for i, hs := range servers {
		go func() { served <- hs.Serve(listeners[i]) }()
	}
	a.sched.Start()
	fmt.Fprintf(stdout, "closeorder %s listening on http://%s (db %s, lock %s, schedule %q); admin %s\n",
		a.cfg.instance, ln.Addr(), backendurl.Redact(a.cfg.db), backendurl.Redact(a.cfg.lock), a.cfg.schedule, admin)

	var serr error
	select {
	case <-ctx.Done():
	case serr = <-served:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := []error{serr}
	for _, hs := range servers {
		errs = append(errs, hs.Shutdown(sctx))
	}
	errs = append(errs, a.sched.Stop(sctx))
	return errors.Join(errs...)
}

// httpServer bounds what a client may hold: a request must arrive whole
// within -read-timeout (a client that sends headers and then part of a
// body is cut off), and an idle connection is closed.
func (a *app) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(5*time.Second, a.cfg.readTimeout),
		ReadTimeout:       a.cfg.readTimeout,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
}

// closeUnpaid is the close job: it closes the orders unpaid for longer than
// -unpaid-after, each with a write fenced by the run's token.
func (a *app) closeUnpaid(ctx context.Context) error {
	run, ok := scheduler.RunFrom(ctx)
	if !ok {
		return errors.New("close job called outside the scheduler")
	}
	token := run.Lock.Token()
	// A run whose start could not be recorded still runs: the observer
	// records it when it ends (recordRun).
	if err := a.orders.startRun(ctx, closeJob, run.Slot, a.cfg.instance, token); err != nil {
		a.log.WarnContext(ctx, "recording a run's start", "slot", run.Slot, "error", err)
	}
	closed, err := a.orders.closeExpired(ctx, now().Add(-a.cfg.unpaidAfter), a.cfg.instance, token, a.cfg.workDelay)
	if rerr := a.orders.setClosed(closeJob, run.Slot, a.cfg.instance, closed, errors.Is(err, errStaleHolder)); rerr != nil {
		a.log.WarnContext(ctx, "recording a run's closed orders", "slot", run.Slot, "closed", closed, "error", rerr)
	}
	if closed > 0 || err != nil {
		a.log.InfoContext(ctx, "close job", "slot", run.Slot, "token", token, "closed", closed, "error", err)
	}
	return err
}

// recordRun stores every run's outcome, skipped and misfired runs included.
func (a *app) recordRun(r scheduler.RunRecord) {
	if err := a.orders.finishRun(r); err != nil {
		a.log.Error("recording a job run", "job", r.Job, "slot", r.Slot, "error", err)
	}
}
