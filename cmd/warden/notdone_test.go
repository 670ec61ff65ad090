package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestNotDoneWhenUnreachable: a release or a delete on a backend that
// cannot be reached at all, its port closed, fails before its request is
// sent, and says plainly that nothing was done: "no answer" alone would
// send the operator to check, or let them take it for done.
func TestNotDoneWhenUnreachable(t *testing.T) {
	closed := drivertest.ClosedAddr(t)
	_, port, _ := strings.Cut(closed, ":")
	for scheme, u := range map[string]string{
		"redis": "redis://" + closed,
		// Three nodes, on three loopback addresses of the closed port.
		"redlock":  "redlock://" + closed + ",127.0.0.2:" + port + ",127.0.0.3:" + port,
		"etcd":     "etcd://" + closed,
		"zk":       "zk://" + closed,
		"consul":   "consul://" + closed,
		"postgres": "postgres://warden:warden@" + closed + "/warden?sslmode=disable",
		"mysql":    "mysql://warden:warden@tcp(" + closed + ")/warden?parseTime=true",
	} {
		t.Run(scheme, func(t *testing.T) {
			code, out, errOut := cliRun(t, "", "-lock", u, "-timeout", "2s", "-yes", "locks", "release", "-any-holder", "k")
			t.Logf("release: exit %d: %s", code, strings.TrimSpace(errOut))
			if want := `"k" was not released: `; code != 1 || !strings.Contains(errOut, want) || strings.Contains(errOut, "may have") || out != "" {
				t.Errorf("release on a closed port: exit %d, %q, %q; want 1 and %q", code, out, errOut, want)
			}
			if scheme == "redlock" {
				return // no idempotency store
			}
			code, out, errOut = cliRun(t, "", "-lock", u, "-timeout", "2s", "-yes", "idem", "delete", "s", "k")
			t.Logf("delete: exit %d: %s", code, strings.TrimSpace(errOut))
			if want := `the record under scope "s", key "k" was not deleted: `; code != 1 || !strings.Contains(errOut, want) || strings.Contains(errOut, "may have") || out != "" {
				t.Errorf("delete on a closed port: exit %d, %q, %q; want 1 and %q", code, out, errOut, want)
			}
		})
	}
}

// TestNotDoneWhenDownAfterPrompt: the backend goes down while the operator
// reads the prompt, its port closed and its connections reset, so that the
// release confirmed, or the delete, cannot be sent. Where the client's
// error proves that the request never left (a connection refused, a write
// that pgx failed before sending a byte, every ZooKeeper server tried in
// vain), the command says that nothing was done, and the lock is held
// still, the record kept; where it does not (etcd, whose client waits for a
// member until the bound ends), it says that it may have been done.
func TestNotDoneWhenDownAfterPrompt(t *testing.T) {
	ctx := context.Background()
	urls := backendURLs(t)
	delete(urls, "sqlite")
	urls["consul"] = "consul://" + drivertest.Addr(t, "WARDEN_CONSUL_ADDR", "127.0.0.1:18500")
	for scheme, u := range urls {
		t.Run(scheme, func(t *testing.T) {
			addr := serverAddr(t, scheme, u)
			// What the command may say: "not" done, or "may" have been.
			may := map[string]bool{"not": true}
			timeout := "10s" // ZooKeeper's client tries its servers again every second
			switch scheme {
			case "etcd":
				may, timeout = map[string]bool{"may": true}, "2s"
			case "zk":
				// Not done once the client has seen the reset and
				// tried the server again; written on the reset
				// connection before the client saw it, the request
				// may have gone out.
				may["may"] = true
			}
			// down runs the command with the backend going down at its
			// prompt, and returns what it said.
			down := func(notDone, mayBeDone string, args ...string) string {
				t.Helper()
				p := drivertest.StartProxy(t, addr)
				stdin := &answerAfter{answer: strings.NewReader("y\n"), meanwhile: p.Down}
				args = append([]string{"-lock", strings.Replace(u, addr, p.Addr(), 1), "-timeout", timeout}, args...)
				code, out, errOut := cliRunWith(stdin, args...)
				t.Logf("%s: exit %d: %s", args[4:6], code, lastLine(errOut))
				said := map[bool]string{true: "not", false: "may"}[strings.Contains(errOut, notDone)]
				if code != 1 || out != "" || !may[said] || said == "may" && !strings.Contains(errOut, mayBeDone) {
					t.Errorf("%s with the backend down after the prompt: exit %d, %q, %q; want 1 and %q", args[4:6], code, out, errOut, notDone)
				}
				return said
			}

			g := serviceGuard(t, u, "orders-svc/7", 10*time.Second)
			key := fmt.Sprintf("cli-down/%s/%d", scheme, time.Now().UnixNano())
			held, err := g.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Unlock(ctx)
			said := down(fmt.Sprintf("%q was not released: ", key), fmt.Sprintf("%q may have been released; warden locks show tells: ", key),
				"locks", "release", key)
			if in, err := g.Inspect(ctx, key); said == "not" && (err != nil || len(in.Holders) != 1 || in.Holders[0].Token != held.Token()) {
				t.Errorf("after a release said not done: %+v, %v; want the holder's lock (token %d)", in, err, held.Token())
			}

			store := openStore(t, u)
			if _, err := store.Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Owner: "api-1:o", Lease: time.Minute}); err != nil {
				t.Fatal(err)
			}
			record := fmt.Sprintf("the record under scope %q, key %q", "s", key)
			said = down(record+" was not deleted: ", record+" may have been deleted; warden idem show tells: ", "idem", "delete", "s", key)
			if _, err := store.Get(ctx, "s", key); said == "not" && err != nil {
				t.Errorf("after a delete said not done: %v; want the record kept", err)
			}
		})
	}
}

// serverAddr is the host:port of the server that u, a URL of scheme,
// names.
func serverAddr(t *testing.T, scheme, u string) string {
	t.Helper()
	switch scheme {
	case "mysql":
		if _, rest, ok := strings.Cut(u, "tcp("); ok {
			if addr, _, ok := strings.Cut(rest, ")"); ok {
				return addr
			}
		}
	case "postgres":
		if pu, err := url.Parse(u); err == nil {
			return pu.Host
		}
	default:
		if addr, ok := strings.CutPrefix(u, scheme+"://"); ok {
			return addr
		}
	}
	t.Fatal(errors.New("no server address in " + u))
	return ""
}
