package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// answerAfter is an operator's terminal: the answer is typed only once the
// prompt has been read, and before it, meanwhile does what happens while
// the operator reads.
type answerAfter struct {
	meanwhile func()
	answer    io.Reader
}

func (a *answerAfter) Read(p []byte) (int, error) {
	if a.meanwhile != nil {
		a.meanwhile()
		a.meanwhile = nil
	}
	return a.answer.Read(p)
}

// cliRunWith runs the command line args with stdin as the terminal.
func cliRunWith(stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	var out, errOut strings.Builder
	code = run(context.Background(), args, stdin, &out, &errOut)
	return code, out.String(), errOut.String()
}

// serviceGuard is a service's Guard on url, on clients of its own.
func serviceGuard(t *testing.T, url, owner string, ttl time.Duration) *guard.Guard {
	t.Helper()
	u, err := backendurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	o := backendurl.NewOpener()
	t.Cleanup(o.Close)
	locker, err := o.Locker(context.Background(), u, ttl)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithOwner(owner), guard.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestReleaseWhatWasConfirmed: the operator is shown holder A and confirms;
// while the prompt is read, A leaves and B takes the lock. The release must
// not take B's lock: it is refused, naming B, with an exit status of its
// own, and B keeps its lock. With -yes, the release needs the token of the
// holding (or -any-holder), and removes exactly the holding named.
func TestReleaseWhatWasConfirmed(t *testing.T) {
	for name, url := range backendURLs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			const ttl = 2 * time.Second
			ga := serviceGuard(t, url, "orders-svc/7", ttl)
			gb := serviceGuard(t, url, "orders-svc/8", ttl)
			key := fmt.Sprintf("cli-release/%s/%d", name, time.Now().UnixNano())
			a, err := ga.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			var b *guard.Lock
			stdin := &answerAfter{answer: strings.NewReader("y\n"), meanwhile: func() {
				if err := a.Unlock(ctx); err != nil {
					t.Errorf("A's Unlock: %v", err)
				}
				if b, err = gb.TryLock(ctx, key); err != nil {
					t.Errorf("B's TryLock after A left: %v", err)
				}
			}}
			code, out, errOut := cliRunWith(stdin, "-lock", url, "locks", "release", key)
			if b == nil {
				t.FailNow()
			}
			defer b.Unlock(ctx)
			wantErr := fmt.Sprintf(`the lock changed hands: now held by "orders-svc/8" with token %d`, b.Token())
			if code != 3 || !strings.Contains(errOut, wantErr) || strings.Contains(out, "released") {
				t.Fatalf("release confirmed for A while B held: exit %d, %q, %q; want exit 3 and %q", code, out, errOut, wantErr)
			}
			if !strings.Contains(errOut, `"orders-svc/7" with token `+strconv.FormatUint(a.Token(), 10)) {
				t.Fatalf("the prompt %q does not name A (token %d)", errOut, a.Token())
			}
			// B keeps its lock: the backend still shows it, its section
			// goes on, and it can give the lock back itself.
			if in, err := gb.Inspect(ctx, key); err != nil || len(in.Holders) != 1 || in.Holders[0].Token != b.Token() {
				t.Fatalf("after the refused release: %+v, %v; want B (token %d) holding", in, err, b.Token())
			}
			if b.Context().Err() != nil {
				t.Fatalf("B's section was cancelled by a refused release: %v", b.Err())
			}

			// -yes without naming the holding is refused before anything
			// is done.
			code, _, errOut = cliRun(t, "", "-lock", url, "-yes", "locks", "release", key)
			if code != 2 || !strings.Contains(errOut, "-yes needs -token N or -any-holder") {
				t.Fatalf("release -yes without -token: exit %d, %q; want 2 and what it needs", code, errOut)
			}
			// -yes with A's token, no longer a holder's.
			code, out, errOut = cliRun(t, "", "-lock", url, "-yes", "locks", "release", "-token", strconv.FormatUint(a.Token(), 10), key)
			if code != 3 || !strings.Contains(errOut, wantErr) {
				t.Fatalf("release -yes -token A's: exit %d, %q, %q; want 3 and %q", code, out, errOut, wantErr)
			}
			if err := b.Err(); err != nil {
				t.Fatalf("B after the refused releases: %v", err)
			}
			// -yes with B's token: B goes, and is told.
			code, out, errOut = cliRun(t, "", "-lock", url, "-yes", "locks", "release", key, "-token", strconv.FormatUint(b.Token(), 10))
			want := fmt.Sprintf(`released %q from "orders-svc/8" (token %d)`, key, b.Token())
			if code != 0 || !strings.Contains(out, want) {
				t.Fatalf("release -yes -token B's: exit %d, %q, %q; want 0 and %q", code, out, errOut, want)
			}
			select {
			case <-b.Context().Done():
			case <-time.After(3 * ttl):
				t.Fatal("B's context was not cancelled after its release")
			}

			// -any-holder takes whoever holds it, listed in the prompt.
			c, err := ga.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Unlock(ctx)
			code, out, errOut = cliRun(t, "y\n", "-lock", url, "locks", "release", "-any-holder", key)
			held := fmt.Sprintf(`"orders-svc/7" with token %d`, c.Token())
			want = fmt.Sprintf(`released %q from "orders-svc/7" (token %d)`, key, c.Token())
			if code != 0 || !strings.Contains(errOut, held) || !strings.Contains(out, want) {
				t.Fatalf("release -any-holder: exit %d, %q, %q; want the prompt to list %s and %q", code, out, errOut, held, want)
			}
		})
	}
}

// TestReleaseOneReader: of a read lock's readers, the prompt lists the one
// the release removes, and only that one goes; without -token, a release
// of a lock with several holders is refused, naming them. Backends whose
// Inspect does not show readers on the lock's key are skipped.
func TestReleaseOneReader(t *testing.T) {
	for name, url := range backendURLs(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			const ttl = 2 * time.Second
			g1 := serviceGuard(t, url, "report-reader/1", ttl)
			g2 := serviceGuard(t, url, "report-reader/2", ttl)
			key := fmt.Sprintf("cli-readers/%s/%d", name, time.Now().UnixNano())
			r1, err := g1.Lock(ctx, key, guard.Read())
			if errors.Is(err, guard.ErrUnsupported) {
				t.Skip("no read locks on this backend")
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r1.Unlock(ctx)
			r2, err := g2.Lock(ctx, key, guard.Read())
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Unlock(ctx)
			if in, err := g1.Inspect(ctx, key); err != nil || len(in.Holders) != 2 {
				t.Skipf("Inspect shows %+v, %v of the read lock: its readers cannot be named", in, err)
			}

			code, out, errOut := cliRun(t, "y\n", "-lock", url, "locks", "release", key)
			for _, r := range []*guard.Lock{r1, r2} {
				if tok := strconv.FormatUint(r.Token(), 10); !strings.Contains(errOut, tok) {
					t.Errorf("release of a lock with two readers without -token: %q does not name token %s", errOut, tok)
				}
			}
			if code != 2 || !strings.Contains(errOut, "2 holders") || strings.Contains(out, "released") || r1.Err() != nil || r2.Err() != nil {
				t.Fatalf("release of two readers without -token: exit %d, %q, %q; want 2, both named and kept", code, out, errOut)
			}

			code, out, errOut = cliRun(t, "y\n", "-lock", url, "locks", "release", "-token", strconv.FormatUint(r2.Token(), 10), key)
			want := fmt.Sprintf(`released %q from "report-reader/2" (token %d)`, key, r2.Token())
			if code != 0 || !strings.Contains(out, want) || strings.Contains(out+errOut, "report-reader/1") {
				t.Fatalf("release -token of reader 2: exit %d, %q, %q; want 0, the prompt and %q naming reader 2 alone", code, out, errOut, want)
			}
			select {
			case <-r2.Context().Done():
			case <-time.After(3 * ttl):
				t.Fatal("reader 2's context was not cancelled after its release")
			}
			if in, err := g1.Inspect(ctx, key); err != nil || len(in.Holders) != 1 || in.Holders[0].Token != r1.Token() {
				t.Fatalf("after the release of reader 2: %+v, %v; want reader 1 (token %d) alone", in, err, r1.Token())
			}
			if err := r1.Unlock(ctx); err != nil {
				t.Fatalf("reader 1's Unlock: %v, want its lock kept", err)
			}
		})
	}
}

// TestReleaseBadFlags: what the release is told is checked before a
// backend is opened.
func TestReleaseBadFlags(t *testing.T) {
	redis := "redis://127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-lock", redis, "-yes", "locks", "release", "k"}, "-yes needs -token N or -any-holder"},
		{[]string{"-lock", redis, "locks", "release", "-token", "3", "-any-holder", "k"}, "either -token or -any-holder"},
		{[]string{"-lock", redis, "locks", "release", "-token", "0", "k"}, "-token 0"},
		{[]string{"-lock", redis, "locks", "release", "-token", "x", "k"}, "-token"},
		{[]string{"-lock", redis, "locks", "release", "-token", "3"}, "want KEY"},
		{[]string{"-lock", redis, "locks", "release", "a", "b"}, "want KEY"},
	} {
		code, _, errOut := cliRun(t, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("warden %q: exit %d, %q; want 2 and an error naming %q", tc.args, code, errOut, tc.want)
		}
	}
}

// partialRelease is the memory backend whose forced release fails after it
// removed what it removed, as a backend that removes many holders in
// several steps does when a later step is refused (consullock past 42
// holders).
type partialRelease struct{ *memory.Locker }

func (p partialRelease) ForceRelease(ctx context.Context, key string, target driver.ReleaseTarget) ([]driver.Holding, error) {
	removed, err := p.Locker.ForceRelease(ctx, key, target)
	if err != nil {
		return removed, err
	}
	return removed, fmt.Errorf("%w: a later step was refused", driver.ErrUnavailable)
}

// A release that fails partway says which holders it removed, and fails:
// it said only the error, while those holders were gone.
func TestReleasedInPartIsSaid(t *testing.T) {
	ctx := context.Background()
	mem := memory.New()
	holder, err := guard.New(mem, guard.WithOwner("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(partialRelease{mem})
	if err != nil {
		t.Fatal(err)
	}
	for _, asJSON := range []bool{false, true} {
		key := fmt.Sprint("report-json-", asJSON)
		if _, err := holder.Lock(ctx, key); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		c := &cli{stdin: bufio.NewReader(strings.NewReader("")), stdout: &gate{w: &out}, stderr: io.Discard, timeout: time.Minute, g: g, json: asJSON}
		err := release{cli: c, key: key, any: true}.release(ctx, guard.ReleaseTarget{AnyHolder: true})
		if !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(out.String(), "worker-1") {
			t.Errorf("json %v: %v, printed %q; want the refusal, and the holder removed printed", asJSON, err, out.String())
		}
	}
}

// TestReleaseWithAnswerLost: the release confirmed reaches the server,
// which removes the holder, but its answer is lost. The command fails, as
// it must, yet does not leave the operator to read "no answer" as "nothing
// was released": it says the release may have been done, and how to tell.
func TestReleaseWithAnswerLost(t *testing.T) {
	ctx := context.Background()
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	g := serviceGuard(t, "redis://"+addr, "orders-svc/7", 30*time.Second)
	key := fmt.Sprintf("cli-release-lost/%d", time.Now().UnixNano())
	l, err := g.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	proxy := drivertest.StartProxy(t, addr)
	stdin := &answerAfter{answer: strings.NewReader("y\n"), meanwhile: proxy.LoseReplies}
	code, out, errOut := cliRunWith(stdin, "-lock", "redis://"+proxy.Addr(), "-timeout", "1s", "locks", "release", key)
	if in, err := g.Inspect(ctx, key); err != nil || len(in.Holders) != 0 {
		t.Fatalf("the release whose answer was lost: %+v, %v; want it done on the server", in, err)
	}
	// What follows is the client's error: no answer within the bound, or
	// the read timeout that the bound set on the connection, whichever
	// ends first.
	want := fmt.Sprintf("%q may have been released; warden locks show tells: ", key)
	if code != 1 || !strings.Contains(errOut, want) || strings.Count(errOut, "warden: ") != 1 || strings.Contains(out, "released") {
		t.Errorf("release with its answer lost: exit %d, %q, %q; want 1 and %q", code, out, errOut, want)
	}
}

// TestDeleteWithAnswerLost: as TestReleaseWithAnswerLost, for an
// idempotency record's delete.
func TestDeleteWithAnswerLost(t *testing.T) {
	ctx := context.Background()
	addr := drivertest.Addr(t, "WARDEN_REDIS_ADDR", "127.0.0.1:16379")
	store := openStore(t, "redis://"+addr)
	key := fmt.Sprintf("cli-delete-lost-%d", time.Now().UnixNano())
	if _, err := store.Claim(ctx, idempotency.Claim{Scope: "s", Key: key, Owner: "api-1:o", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, "s", key, "api-1:o", []byte("done"), time.Minute); err != nil {
		t.Fatal(err)
	}
	proxy := drivertest.StartProxy(t, addr)
	stdin := &answerAfter{answer: strings.NewReader("y\n"), meanwhile: proxy.LoseReplies}
	code, out, errOut := cliRunWith(stdin, "-lock", "redis://"+proxy.Addr(), "-timeout", "1s", "idem", "delete", "s", key)
	if _, err := store.Get(ctx, "s", key); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("the delete whose answer was lost: %v; want it done on the server", err)
	}
	// The client's error follows, as for a release.
	want := fmt.Sprintf("the record under scope %q, key %q may have been deleted; warden idem show tells: ", "s", key)
	if code != 1 || !strings.Contains(errOut, want) || strings.Count(errOut, "warden: ") != 1 || strings.Contains(out, "deleted") {
		t.Errorf("delete with its answer lost: exit %d, %q, %q; want 1 and %q", code, out, errOut, want)
	}
}
