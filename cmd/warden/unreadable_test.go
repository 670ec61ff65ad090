package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// listedAs is the memory backend whose List pages list the lock key
// unreadable (if held) as a backend lists one its user may not read, and
// come with err, as a page from which the backend left out such locks
// does.
type listedAs struct {
	*memory.Locker
	unreadable string
	err        error
}

func (l listedAs) List(ctx context.Context, prefix, after string, limit int) ([]driver.Listed, error) {
	page, err := l.Locker.List(ctx, prefix, after, limit)
	if err != nil {
		return nil, err
	}
	for i := range page {
		if page[i].Key == l.unreadable {
			page[i] = driver.Listed{Key: page[i].Key, Err: fmt.Errorf("%w: refused by the ACL", driver.ErrUnavailable)}
		}
	}
	return page, l.err
}

// lsOn runs locks ls with args on a Guard of backend, whose services' prefix
// is "warden:", with the locks keys held there by "svc-1"; it returns the
// command's output, its notes and its error.
func lsOn(t *testing.T, backend driver.Locker, asJSON bool, keys []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx := context.Background()
	g, err := guard.New(backend, guard.WithOwner("svc-1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		l, err := g.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(ctx)
	}
	var out, notes bytes.Buffer
	c := &cli{stdin: bufio.NewReader(strings.NewReader("")), stdout: &gate{w: &out}, stderr: &notes, timeout: time.Minute,
		g: g, json: asJSON, limit: 100, prefix: "warden:"}
	do, err := c.command(append([]string{"locks", "ls"}, args...))
	if err != nil {
		t.Fatal(err)
	}
	c.restartBound()
	err = do(ctx)
	return out.String(), notes.String(), err
}

// exitOf is the exit status run gives err.
func exitOf(err error) int {
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return 1
}

// TestListPartialExitsFour: a page from which the backend left out locks
// its user may not read, saying only that it did (Consul's ACLs), is
// printed, and the command exits with status 4 and says the page is not
// the whole list, in a table as in JSON.
func TestListPartialExitsFour(t *testing.T) {
	partial := fmt.Errorf("%w: some keys were filtered", driver.ErrPartialList)
	for _, asJSON := range []bool{false, true} {
		out, _, err := lsOn(t, listedAs{Locker: memory.New(), err: partial}, asJSON, []string{"a"})
		if exitOf(err) != exitUnreadable || !strings.Contains(fmt.Sprint(err), "not the whole list") || !strings.Contains(out, "svc-1") {
			t.Errorf("json %v: %q, %v; want the lock listed, exit %d, and the page said not to be whole", asJSON, out, err, exitUnreadable)
		}
	}
}

// TestUnreadableInJSON: -json gives a lock that could not be read null
// holders and waiters beside its error, so that a script that misses the
// error does not take it for a free lock; a lock read has its holders and
// waiters.
func TestUnreadableInJSON(t *testing.T) {
	out, _, err := lsOn(t, listedAs{Locker: memory.New(), unreadable: "warden:b"}, true, []string{"a", "b"})
	var page []map[string]json.RawMessage
	if jerr := json.Unmarshal([]byte(out), &page); jerr != nil || exitOf(err) != exitUnreadable || len(page) != 2 {
		t.Fatalf("locks ls -json: %q, %v (%v); want two locks and exit %d", out, err, jerr, exitUnreadable)
	}
	for _, in := range page {
		unread := string(in["key"]) == `"b"`
		for _, f := range []string{"holders", "waiters"} {
			if null := string(in[f]) == "null"; null != unread {
				t.Errorf("%s: %s %s, error %s; want null for b alone", in["key"], f, in[f], in["error"])
			}
		}
	}
}

// TestHintCountsOnlyHeld: locks ls of a prefix copied from the backend
// (with the Guard's prefix) that finds nothing names the locks found
// without it as held only when they were read held: a lock that could not
// be read may be one nobody holds any longer. One that could not be read
// before a held one does not hide it.
func TestHintCountsOnlyHeld(t *testing.T) {
	for _, c := range []struct {
		keys             []string
		unreadable, want string
	}{
		{[]string{"a"}, "", "locks are held"},
		{[]string{"a"}, "warden:a", "locks exist that this user may not read"},
		{[]string{"a", "b"}, "warden:a", "locks are held"},
	} {
		_, notes, err := lsOn(t, listedAs{Locker: memory.New(), unreadable: c.unreadable}, false, c.keys, "warden:")
		if err != nil || !strings.Contains(notes, c.want+": keys are named without the Guard's prefix") {
			t.Errorf("locks %q, %q unreadable: note %q, %v; want %q", c.keys, c.unreadable, notes, err, c.want)
		}
	}
}
