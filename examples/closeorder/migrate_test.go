package main

import (
	"bufio"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard"
)

// holdMigrateLock takes the lock the replicas migrate under, on the
// SQLite database at url, as a replica still migrating holds it, and
// returns the function that lets it go.
func holdMigrateLock(t *testing.T, url string) func() {
	t.Helper()
	opener := backendurl.NewOpener()
	t.Cleanup(opener.Close)
	u, err := backendurl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := opener.Locker(t.Context(), u, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithPrefix("closeorder:"), guard.WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := g.Lock(t.Context(), migrateLock)
	if err != nil {
		t.Fatal(err)
	}
	release := func() {
		if err := l.Unlock(context.Background()); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { l.Unlock(context.Background()) })
	return release
}

// A replica that cannot take the migrate lock says so, naming -lock: it
// blamed -db ("-db sqlite:///…: migrating: warden: lock \"migrate\" not
// acquired…"), whose database it had not yet touched.
func TestMigrateLockFailureNamesLock(t *testing.T) {
	db := "sqlite://" + filepath.Join(t.TempDir(), "orders.db")
	holdMigrateLock(t, db)
	// Told to stop while it waits for the lock.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var stderr strings.Builder
	code := run(ctx, []string{"-addr", "127.0.0.1:0", "-admin-addr", "", "-db", db, "-lock", db}, io.Discard, &stderr)
	lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
	last := lines[len(lines)-1]
	if code != 1 || !strings.HasPrefix(last, "closeorder: -lock "+db+": ") || !strings.Contains(last, `"migrate"`) {
		t.Fatalf("a replica that could not take the migrate lock: exit %d, %q; want 1 and a last line naming -lock and the lock", code, stderr.String())
	}
	// Before it waited, it said whom it waited for: a deploy stuck
	// behind a migration that hangs waited without a word.
	if !strings.Contains(lines[0], "waiting for the replica that holds the lock") || !strings.Contains(lines[0], "holder=") {
		t.Errorf("first line %q; want a line saying it waits for the lock's holder, naming it", lines[0])
	}
}

// A replica waits for the migrate lock for as long as another replica
// holds it, here 65s: it gave up after a minute whatever the migration's
// length, and exited 1.
func TestMigrateWaitsForTheLockHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("takes more than a minute")
	}
	db := "sqlite://" + filepath.Join(t.TempDir(), "orders.db")
	release := holdMigrateLock(t, db)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out, stdout := io.Pipe()
	var stderr strings.Builder
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"-addr", "127.0.0.1:0", "-admin-addr", "", "-db", db, "-lock", db, "-schedule", "@every 1h"}, stdout, &stderr)
		stdout.Close()
	}()
	listening := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			if strings.Contains(lines.Text(), "listening on http://") {
				close(listening)
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	held := time.NewTimer(65 * time.Second)
	defer held.Stop()
	select {
	case code := <-exited:
		t.Fatalf("the replica exited %d while the lock was held: %s", code, stderr.String())
	case <-listening:
		t.Fatal("the replica listened while the lock was held")
	case <-held.C:
	}
	release()
	select {
	case <-listening:
	case code := <-exited:
		t.Fatalf("the replica exited %d once the lock was let go: %s", code, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the replica did not listen within 30s of the lock's release")
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("exit %d after a clean shutdown: %s", code, stderr.String())
	}
}
