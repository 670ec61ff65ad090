package sqllock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// holderEnv carries "database|key|dsn" to the holder process.
const holderEnv = "WARDEN_SQL_TEST_HOLDER"

// TestHelperHolder is not a test: run by TestKilledHolder as a separate
// process, it takes a lock, reports its token on stdout and waits to be
// killed.
func TestHelperHolder(t *testing.T) {
	spec := os.Getenv(holderEnv)
	if spec == "" {
		t.Skip("helper process for TestKilledHolder")
	}
	parts := strings.SplitN(spec, "|", 3)
	var db database
	for _, d := range databases() {
		if d.name == parts[0] {
			db = d
		}
	}
	l := newLocker(t, openDB(t, db, parts[2]))
	lease, err := l.Acquire(context.Background(), parts[1], driver.AcquireOptions{TTL: killTTL})
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("held %d\n", lease.Token())
	time.Sleep(time.Hour)
}

const killTTL = 1500 * time.Millisecond

// TestKilledHolder kills -9 a process holding a lock: the lock comes free
// after the lease's TTL.
func TestKilledHolder(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			dsn := db.dsn(t)
			l := newLocker(t, migrated(t, db, dsn))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			k := uniqueKey(t)

			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperHolder$", "-test.count=1")
			cmd.Env = append(os.Environ(), holderEnv+"="+strings.Join([]string{db.name, k, dsn}, "|"))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer cmd.Process.Kill()
			line, err := bufio.NewReader(out).ReadString('\n')
			var held uint64
			if _, scanErr := fmt.Sscanf(line, "held %d", &held); err != nil || scanErr != nil {
				t.Fatalf("holder process: %q, %v", line, err)
			}
			heldAt := time.Now()
			if _, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: killTTL}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("Acquire while the holder process lives: got %v, want ErrNotAcquired", err)
			}

			if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup runs
				t.Fatal(err)
			}
			cmd.Wait()
			killedAt := time.Now()
			// Long enough that only the lease's expiry can explain the
			// success.
			lease, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
			if err != nil {
				t.Fatalf("Acquire after the holder was killed: %v", err)
			}
			defer lease.Release(context.Background())
			t.Logf("freed %v after kill -9 (TTL %v)", time.Since(killedAt), killTTL)
			if waited := time.Since(heldAt); waited < killTTL/2 {
				t.Errorf("lease of a killed holder taken over after %v, before half its TTL %v", waited, killTTL)
			}
			if lease.Token() <= held {
				t.Errorf("token %d after the killed holder's %d", lease.Token(), held)
			}
		})
	}
}
