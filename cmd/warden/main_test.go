package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// cliRun runs the command line args with stdin, as a shell would.
func cliRun(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// backendURLs are the real servers the CLI is tried on, by name.
func backendURLs(t *testing.T) map[string]string {
	return map[string]string{
		"redis":    "redis://" + drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379"),
		"etcd":     "etcd://" + drivertest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379"),
		"zk":       "zk://" + drivertest.Addr(t, "WARDEN_ZK_SERVERS", "127.0.0.1:12181"),
		"postgres": envOr("WARDEN_POSTGRES_DSN", "postgres://warden:warden@127.0.0.1:15432/warden?sslmode=disable"),
		"mysql":    "mysql://" + envOr("WARDEN_MYSQL_DSN", "warden:warden@tcp(127.0.0.1:13306)/warden?parseTime=true"),
		"sqlite":   "sqlite://" + filepath.Join(t.TempDir(), "cli.db"),
	}
}

// TestOnEveryBackend holds a lock as a service would, then looks at it,
// refuses to release it on a "no", releases it on a "yes" (the holder's
// context is cancelled, whether its backend renews it per lock or keeps it
// on a session, and another service waiting meanwhile gets the lock with a
// greater token), and shows an idempotency record without its owner token.
func TestOnEveryBackend(t *testing.T) {
	for name, url := range backendURLs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			u, err := backendurl.Parse(url)
			if err != nil {
				t.Fatal(err)
			}
			o := backendurl.NewOpener()
			t.Cleanup(o.Close)
			const ttl = 2 * time.Second
			locker, err := o.Locker(ctx, u, ttl)
			if err != nil {
				t.Fatal(err)
			}
			g, err := guard.New(locker, guard.WithOwner("orders-svc/7"), guard.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("cli/%s/%d", name, time.Now().UnixNano())
			held, err := g.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Unlock(ctx)

			code, out, errOut := cliRun(t, "", "-lock", url, "locks", "ls", "cli/"+name+"/")
			if code != 0 || !strings.Contains(out, key) || !strings.Contains(out, "orders-svc/7") {
				t.Fatalf("locks ls: %d %q %q; want the held key and its owner", code, out, errOut)
			}
			code, out, errOut = cliRun(t, "", "-lock", url, "-json", "locks", "show", key)
			var in guard.Inspection
			if code != 0 || json.Unmarshal([]byte(out), &in) != nil || len(in.Holders) != 1 || in.Holders[0].Token != held.Token() {
				t.Fatalf("locks show -json: %d %q %q; want one holder with token %d", code, out, errOut, held.Token())
			}

			code, _, errOut = cliRun(t, "n\n", "-lock", url, "locks", "release", key)
			if code != 1 || !strings.Contains(errOut, "not released") || held.Err() != nil {
				t.Fatalf("release answered no: %d %q, holder %v; want exit 1 and the lock kept", code, errOut, held.Err())
			}
			// Another service waits for the lock meanwhile, on clients of
			// its own; its waiters gauge says when it is in Lock.
			reader := sdkmetric.NewManualReader()
			o2 := backendurl.NewOpener()
			t.Cleanup(o2.Close)
			locker2, err := o2.Locker(ctx, u, ttl)
			if err != nil {
				t.Fatal(err)
			}
			g2, err := guard.New(locker2, guard.WithOwner("orders-svc/8"), guard.WithTTL(ttl),
				guard.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
			if err != nil {
				t.Fatal(err)
			}
			type grant struct {
				l   *guard.Lock
				err error
			}
			granted := make(chan grant, 1)
			go func() {
				l, err := g2.Lock(ctx, key, guard.WaitAtMost(10*ttl))
				granted <- grant{l, err}
			}()
			waitFor(t, "the second service to wait", func() bool { return waiting(t, reader) == 1 })

			code, out, errOut = cliRun(t, "y\n", "-lock", url, "locks", "release", key)
			if code != 0 || !strings.Contains(out, fmt.Sprintf("released %q from %q", key, "orders-svc/7")) {
				t.Fatalf("release answered yes: %d %q %q", code, out, errOut)
			}
			select {
			case <-held.Context().Done():
			case <-time.After(3 * ttl):
				t.Fatal("the old holder's context was not cancelled after the release")
			}
			if !errors.Is(held.Err(), guard.ErrLockLost) {
				t.Fatalf("the old holder's Err: %v, want ErrLockLost", held.Err())
			}
			w := <-granted
			if w.err != nil {
				t.Fatalf("the waiting service: %v", w.err)
			}
			if w.l.Token() <= held.Token() {
				t.Fatalf("the waiter's token %d after %d", w.l.Token(), held.Token())
			}
			w.l.Unlock(ctx)

			if code, out, errOut := cliRun(t, "", "-lock", url, "ping"); code != 0 || !strings.Contains(out, "answered") {
				t.Fatalf("ping: %d %q %q", code, out, errOut)
			}

			idemHalf(t, o, u, url, key)
		})
	}
}

// idemHalf is the idempotency half of TestOnEveryBackend: a record claimed
// on the backend's store is shown without its owner's token, kept on a
// "no", and deleted with -yes; its owner then finds its claim gone.
func idemHalf(t *testing.T, o *backendurl.Opener, u *backendurl.URL, url, key string) {
	t.Helper()
	ctx := context.Background()
	store, err := o.Store(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-9", Key: key, Fingerprint: "fp-1",
		Owner: "api-3:topsecretownertoken", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cliRun(t, "", "-lock", url, "idem", "show", "user-9", key)
	if code != 0 || !strings.Contains(out, "in_progress") || !strings.Contains(out, "api-3") || strings.Contains(out, "topsecret") {
		t.Fatalf("idem show: %d %q %q; want the in-progress record by api-3, without its token", code, out, errOut)
	}
	if code, _, errOut := cliRun(t, "", "-lock", url, "idem", "show", "user-9", key+"-none"); code != 1 || !strings.Contains(errOut, "no record") {
		t.Fatalf("idem show of nothing: %d %q", code, errOut)
	}
	if code, _, errOut := cliRun(t, "no\n", "-lock", url, "idem", "delete", "user-9", key); code != 1 || !strings.Contains(errOut, "not deleted") {
		t.Fatalf("idem delete answered no: %d %q", code, errOut)
	}
	if code, out, errOut := cliRun(t, "", "-lock", url, "-yes", "idem", "delete", "user-9", key); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("idem delete -yes: %d %q %q", code, out, errOut)
	}
	if _, err := store.Get(ctx, "user-9", key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the record after idem delete: %v, want ErrNotFound", err)
	}
	if err := store.Extend(ctx, "user-9", key, "api-3:topsecretownertoken", time.Minute); !errors.Is(err, idempotency.ErrNotOwner) {
		t.Fatalf("the owner's Extend after idem delete: %v, want ErrNotOwner", err)
	}

	// While the operator reads the prompt about api-3's claim, it goes
	// (here deleted; in life, lapsed) and api-4 claims the key and completes
	// it: the "y" must not delete api-4's record, which nobody showed.
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-9", Key: key, Fingerprint: "fp-1",
		Owner: "api-3:topsecretownertoken", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	stdin := &atPrompt{answer: "y\n", do: func() {
		if err := store.(idempotency.Deleter).Delete(ctx, "user-9", key, ""); err != nil {
			t.Errorf("Delete: %v", err)
		}
		if rec, err := store.Claim(ctx, idempotency.Claim{Scope: "user-9", Key: key, Fingerprint: "fp-1",
			Owner: "api-4:otherownertoken", Lease: time.Minute}); rec != nil || err != nil {
			t.Errorf("api-4's claim: %+v, %v", rec, err)
		}
		if err := store.Complete(ctx, "user-9", key, "api-4:otherownertoken", []byte("201"), time.Minute); err != nil {
			t.Errorf("api-4's Complete: %v", err)
		}
	}}
	var stdout, stderr bytes.Buffer
	if code := run(ctx, []string{"-lock", url, "idem", "delete", "user-9", key}, stdin, &stdout, &stderr); code != exitChanged || !strings.Contains(stderr.String(), "not deleted") {
		t.Fatalf("idem delete of a record claimed again at the prompt: %d %q %q; want exit %d, not deleted", code, stdout.String(), stderr.String(), exitChanged)
	}
	if rec, err := store.Get(ctx, "user-9", key); err != nil || rec.State != idempotency.StateCompleted || rec.Owner != "api-4:otherownertoken" {
		t.Fatalf("api-4's record after the refused delete: %+v, %v", rec, err)
	}

	// A claim shown in progress whose owner completes it at the prompt
	// keeps its result: the retry replays it rather than run the work again.
	if err := store.(idempotency.Deleter).Delete(ctx, "user-9", key, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-9", Key: key, Fingerprint: "fp-1",
		Owner: "api-5:fifthownertoken", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	stdin = &atPrompt{answer: "y\n", do: func() {
		if err := store.Complete(ctx, "user-9", key, "api-5:fifthownertoken", []byte("201"), time.Minute); err != nil {
			t.Errorf("api-5's Complete: %v", err)
		}
	}}
	stdout.Reset()
	stderr.Reset()
	if code := run(ctx, []string{"-lock", url, "idem", "delete", "user-9", key}, stdin, &stdout, &stderr); code != exitChanged {
		t.Fatalf("idem delete of a claim completed at the prompt: %d %q %q; want exit %d", code, stdout.String(), stderr.String(), exitChanged)
	}
	if rec, err := store.Get(ctx, "user-9", key); err != nil || rec.State != idempotency.StateCompleted || rec.Owner != "api-5:fifthownertoken" {
		t.Fatalf("api-5's completed record after the refused delete: %+v, %v", rec, err)
	}
	// Shown completed, it is deleted.
	if code, out, errOut := cliRun(t, "y\n", "-lock", url, "idem", "delete", "user-9", key); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("idem delete of a completed record: %d %q %q", code, out, errOut)
	}
	if _, err := store.Get(ctx, "user-9", key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the completed record after idem delete: %v, want ErrNotFound", err)
	}
}

// atPrompt is an operator's stdin: at the first read, which comes when the
// prompt is shown, it runs do (what happens while the operator reads), then
// answers.
type atPrompt struct {
	do     func()
	answer string
	read   bool
}

func (p *atPrompt) Read(b []byte) (int, error) {
	if !p.read {
		p.read = true
		p.do()
	}
	n := copy(b, p.answer)
	p.answer = p.answer[n:]
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func TestBadInputExitsTwo(t *testing.T) {
	redis := "redis://127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"-lock", redis}, "no command"},
		{[]string{"locks", "ls"}, "no backend"},
		{[]string{"-lock", "bogus", "ping"}, "not a backend URL"},
		{[]string{"-lock", "memory", "ping"}, "in-process"},
		{[]string{"-lock", "postgres://u:hunter2@[::1/db", "ping"}, "xxxxx"},
		{[]string{"-lock", redis, "locks", "show"}, "want KEY"},
		{[]string{"-lock", redis, "locks", "release", "a", "b"}, "want KEY"},
		{[]string{"-lock", redis, "idem", "show", "scope"}, "want SCOPE KEY"},
		{[]string{"-lock", redis, "idem", "show", "s", ""}, "empty key"},
		{[]string{"-lock", redis, "idem", "delete", "s"}, "want SCOPE KEY"},
		{[]string{"-lock", redis, "lock", "ls"}, "unknown command"},
		{[]string{"-lock", redis, "locks"}, "locks needs a command after it: ls, show or release"},
		{[]string{"-lock", redis, "idem"}, "idem needs a command after it: show or delete"},
		{[]string{"-lock", redis, "-limit", "0", "locks", "ls"}, "-limit 0"},
		{[]string{"-lock", redis, "-timeout", "-1s", "ping"}, "not positive"},
		{[]string{"-nosuchflag"}, "not defined"},
	} {
		code, _, errOut := cliRun(t, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "hunter2") {
			t.Errorf("warden %q: exit %d, %q; want 2 and an error naming %q", tc.args, code, errOut, tc.want)
		}
		if lines := strings.Count(strings.TrimSpace(lastLine(errOut)), "\n"); lines != 0 {
			t.Errorf("warden %q: the error is not one line: %q", tc.args, errOut)
		}
	}
}

func TestUnreachableExitsOne(t *testing.T) {
	start := time.Now()
	code, _, errOut := cliRun(t, "", "-lock", "redis://127.0.0.1:1", "-timeout", "2s", "ping")
	if code != 1 || !strings.Contains(errOut, "unavailable") {
		t.Fatalf("ping of nothing: %d %q; want 1 and unavailable", code, errOut)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("ping of nothing took %v with -timeout 2s", took)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func TestMain(m *testing.M) {
	// The CLI reads WARDEN_LOCK and WARDEN_STORE; the tests give -lock and
	// -store, or expect their absence.
	os.Unsetenv("WARDEN_LOCK")
	os.Unsetenv("WARDEN_STORE")
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// waiting is the number of acquisitions the Guard measured by reader waits in.
func waiting(t *testing.T, reader *sdkmetric.ManualReader) int64 {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "warden.lock.waiters" {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// waitFor waits, up to a deadline far beyond what it should take, until
// cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDeletePromptWithoutInstance: a record whose owner token names no
// instance (an Executor's, httpmw's) is asked about without one.
func TestDeletePromptWithoutInstance(t *testing.T) {
	ctx := context.Background()
	url := "sqlite://" + filepath.Join(t.TempDir(), "cli.db")
	store := openStore(t, url)
	const owner = "0123456789abcdef" // random through and through
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "user-9", Key: "k", Fingerprint: "fp", Owner: owner, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, "user-9", "k", owner, []byte("201"), time.Hour); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := cliRun(t, "n\n", "-lock", url, "idem", "delete", "user-9", "k")
	if code != 1 || !strings.Contains(errOut, "delete the completed record under scope user-9, key k?") {
		t.Errorf("idem delete of a record without an instance: exit %d, %q; want the question naming none, then no", code, errOut)
	}
}
