package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// TestCommandEndsWithinTimeout: against a server of each backend that
// accepts connections and never answers, a command ends, failing, within
// -timeout and the grace (give or take the machine's load), not at a client
// library's bound, nor never.
func TestCommandEndsWithinTimeout(t *testing.T) {
	a, _ := drivertest.Unanswering(t)
	b, _ := drivertest.Unanswering(t)
	c, _ := drivertest.Unanswering(t)
	for name, url := range map[string]string{
		"postgres": "postgres://u:p@" + a + "/db?sslmode=disable",
		"mysql":    "mysql://u:p@tcp(" + a + ")/db",
		"redis":    "redis://" + a + "/0",
		"redlock":  "redlock://" + a + "," + b + "," + c + "/0",
		"etcd":     "etcd://" + a,
		"zk":       "zk://" + a,
		"consul":   "consul://" + a,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const timeout = time.Second
			start := time.Now()
			code, out, errOut := cliRun(t, "", "-lock", url, "-timeout", timeout.String(), "locks", "ls")
			took := time.Since(start)
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(errOut))
			// A RedLock asks its masters with a node timeout of its own,
			// and fails sooner, saying how few answered.
			if code != 1 || out != "" || !strings.Contains(errOut, "within -timeout 1s") && !(name == "redlock" && strings.Contains(errOut, "0 of 3 nodes answered")) {
				t.Errorf("exit %d, %q, %q; want 1, nothing on stdout, and the bound named", code, out, errOut)
			}
			if took > timeout+grace+time.Second {
				t.Errorf("locks ls with -timeout %v ended after %v", timeout, took.Round(time.Millisecond))
			}
		})
	}
}

// TestInterruptEndsTheCommand: Ctrl-C ends a command waiting on a server
// that never answers at once, not at -timeout: the process exits within
// the grace, saying it was interrupted.
func TestInterruptEndsTheCommand(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	for name, url := range map[string]func(addr string) string{
		"postgres": func(a string) string { return "postgres://u:p@" + a + "/db?sslmode=disable" },
		"redis":    func(a string) string { return "redis://" + a },
	} {
		t.Run(name, func(t *testing.T) {
			addr, accepted := drivertest.Unanswering(t)
			cmd := exec.Command(bin, "-lock", url(addr), "-timeout", "1m", "locks", "ls")
			cmd.Env = append(os.Environ(), "WARDEN_LOCK=")
			var errOut bytes.Buffer
			cmd.Stderr = &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			// The command waits on the server once it has connected.
			waitFor(t, "the CLI's connection", func() bool { return accepted.Load() > 0 })
			sent := time.Now()
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				took := time.Since(sent)
				t.Logf("%v after %v: %s", err, took.Round(time.Millisecond), strings.TrimSpace(errOut.String()))
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errOut.String(), "interrupt") {
					t.Errorf("after Ctrl-C: %v, %q; want exit 1 saying it was interrupted", err, errOut.String())
				}
				if took > grace+time.Second {
					t.Errorf("the CLI exited %v after Ctrl-C", took.Round(time.Millisecond))
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the CLI was still running 30s after Ctrl-C")
			}
		})
	}
}

// heedful is the memory backend as a network client is: a call whose
// context has ended fails.
type heedful struct{ *memory.Locker }

func (h heedful) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return h.Locker.ForceRelease(ctx, key, target)
}

// heedfulStore is the memory store as heedful is the memory backend.
type heedfulStore struct{ *idempotency.MemoryStore }

func (h heedfulStore) Delete(ctx context.Context, scope, key, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return h.MemoryStore.Delete(ctx, scope, key, owner)
}

// TestPromptTimeNotCounted: the operator takes longer than -timeout to
// answer a prompt; the release or delete confirmed then runs, against a
// backend that answers at once, with a bound of its own.
func TestPromptTimeNotCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		const timeout = time.Second
		g, err := guard.New(heedful{memory.New()}, guard.WithOwner("stuck-worker"), guard.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		held, err := g.Lock(ctx, "report")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(ctx)
		store := heedfulStore{idempotency.NewMemoryStore()}
		if _, err := store.Claim(ctx, idempotency.Claim{Scope: "api", Key: "order-1", Fingerprint: "fp", Owner: "api-1:token", Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range [][]string{{"locks", "release", "report"}, {"idem", "delete", "api", "order-1"}} {
			var out bytes.Buffer
			// The operator reads the prompt for twice the bound.
			stdin := &answerAfter{answer: strings.NewReader("y\n"), meanwhile: func() { time.Sleep(2 * timeout) }}
			c := &cli{stdin: bufio.NewReader(stdin), stdout: &gate{w: &out}, stderr: io.Discard, timeout: timeout, g: g,
				store: func(context.Context) (idempotency.Store, error) { return store, nil }}
			do, err := c.command(cmd)
			if err != nil {
				t.Fatal(err)
			}
			c.restartBound()
			if err := do(ctx); err != nil {
				t.Errorf("%q confirmed after %v: %v; want it done", cmd, 2*timeout, err)
			}
			if !strings.Contains(out.String(), "released") && !strings.Contains(out.String(), "deleted") {
				t.Errorf("%q: %q; want it to say what it did", cmd, out.String())
			}
		}
		if in, err := g.Inspect(ctx, "report"); err != nil || len(in.Holders) != 0 {
			t.Errorf("the lock after its release: %+v, %v; want it free", in, err)
		}
		if _, err := store.Get(ctx, "api", "order-1"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Errorf("the record after its deletion: %v; want ErrNotFound", err)
		}
	})
}

// hungStore is an idempotency store whose Get does not heed its context:
// it answers only when the test lets it.
type hungStore struct {
	idempotency.Store
	answer chan struct{}
}

func (s hungStore) Get(context.Context, string, string) (*idempotency.Record, error) {
	<-s.answer
	return &idempotency.Record{Scope: "api", Key: "order-1", State: idempotency.StateCompleted}, nil
}

// TestUnheededCallAbandoned: a call whose client does not heed its context
// is abandoned at -timeout and the grace: the command fails as unavailable,
// and what the call prints when it answers at last goes nowhere.
func TestUnheededCallAbandoned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Second
		store := hungStore{answer: make(chan struct{})}
		var out bytes.Buffer
		c := &cli{stdin: bufio.NewReader(strings.NewReader("")), stdout: &gate{w: &out}, timeout: timeout,
			store: func(context.Context) (idempotency.Store, error) { return store, nil }}
		do, err := c.command([]string{"idem", "show", "api", "order-1"})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c.restartBound()
		err = do(context.Background())
		if took := time.Since(start); !errors.Is(err, driver.ErrUnavailable) || took != timeout+grace {
			t.Errorf("idem show on a store that never answers: %v after %v; want unavailable after %v", err, took, timeout+grace)
		}
		close(store.answer)
		synctest.Wait()
		if out.Len() != 0 || !c.abandoned {
			t.Errorf("the abandoned call printed %q (abandoned: %t); want nothing", out.String(), c.abandoned)
		}
	})
}

// TestInterruptAtPrompt: Ctrl-C at a prompt ends the wait for the answer,
// saying why, and nothing is released.
func TestInterruptAtPrompt(t *testing.T) {
	ctx := context.Background()
	g, err := guard.New(memory.New(), guard.WithOwner("stuck-worker"), guard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	held, err := g.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	terminal, typing := io.Pipe()
	defer typing.Close()
	prompted := make(chan struct{})
	out := &promptWatch{prompted: prompted}
	c := &cli{stdin: bufio.NewReader(terminal), stdout: &gate{w: io.Discard}, stderr: out, timeout: time.Minute, g: g}
	do, err := c.command([]string{"locks", "release", "report"})
	if err != nil {
		t.Fatal(err)
	}
	interrupted := errors.New("interrupt signal received")
	sigCtx, interrupt := context.WithCancelCause(ctx)
	done := make(chan error, 1)
	c.restartBound()
	go func() { done <- do(sigCtx) }()
	<-prompted
	interrupt(interrupted)
	select {
	case err := <-done:
		if !errors.Is(err, interrupted) {
			t.Errorf("Ctrl-C at the prompt: %v; want the interrupt named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the prompt still waits 10s after Ctrl-C")
	}
	if in, err := g.Inspect(ctx, "report"); err != nil || len(in.Holders) != 1 {
		t.Errorf("the lock after an interrupted release: %+v, %v; want it held still", in, err)
	}
}

// promptWatch is a terminal's screen that tells when a prompt is shown.
type promptWatch struct {
	mu       sync.Mutex
	b        bytes.Buffer
	prompted chan struct{}
}

func (w *promptWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if bytes.HasSuffix(w.b.Bytes(), []byte("[y/N] ")) {
		close(w.prompted)
	}
	return len(p), nil
}
