package sqllock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/idempotency"
)

// pgBouncer starts a PgBouncer of the test's own in front of dsn, a
// PostgreSQL URL, in the given pool mode, and returns dsn through it. The
// test is skipped where pgbouncer is not installed, or fails when
// WARDEN_REQUIRE_SERVERS=1, as for a missing redis-server
// (scripts/services.sh installs it).
func pgBouncer(t *testing.T, dsn, mode string) string {
	t.Helper()
	// Debian installs it in /usr/sbin, which a user's PATH may lack.
	bin, err := exec.LookPath("pgbouncer")
	if _, statErr := os.Stat("/usr/sbin/pgbouncer"); err != nil && statErr == nil {
		bin, err = "/usr/sbin/pgbouncer", nil
	}
	if err != nil {
		drivertest.Unreachable(t, "pgbouncer binary (apt-get install pgbouncer)", "$PATH", err)
		return ""
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := u.User.Password()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// PgBouncer refuses to run as root; then it runs as nobody, which
	// must read its files.
	dir, err := os.MkdirTemp("", "warden-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	db := strings.TrimPrefix(u.Path, "/")
	ini := fmt.Sprintf("[databases]\n%s = host=%s port=%s dbname=%s\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = %d\n"+
		"unix_socket_dir =\nauth_type = plain\nauth_file = %s\npool_mode = %s\ndefault_pool_size = 4\nignore_startup_parameters = extra_float_digits\n",
		db, u.Hostname(), u.Port(), db, port, filepath.Join(dir, "users.txt"), mode)
	for name, text := range map[string]string{"pgbouncer.ini": ini, "users.txt": fmt.Sprintf("%q %q\n", u.User.Username(), pass)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "nobody"}, args...)
	}
	cmd := exec.Command(bin, args...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("pgbouncer's log:\n%s", log.String())
		}
	})
	u.Host = fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", u.Host)
		if err == nil {
			c.Close()
			return u.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer not listening on %s: %v", u.Host, err) // its log follows
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPgBouncerTransactionPooling runs Lockers behind PgBouncer in
// transaction pooling mode, where pgx's prepared statements reach server
// connections that did not prepare them. Every error then says so and how
// to fix it, rather than pass for the database being unavailable, which a
// waiting Acquire would retry until its deadline; with the fix in the DSN
// the Lockers work.
func TestPgBouncerTransactionPooling(t *testing.T) {
	db := databases()[1]
	direct := db.dsn(t)
	pooled := pgBouncer(t, direct, "transaction")
	migrated(t, db, direct)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("default", func(t *testing.T) {
		a := newLocker(t, openDB(t, db, pooled))
		b := newLocker(t, openDB(t, db, pooled))
		k := uniqueKey(t)
		calls, refused := 0, 0
		check := func(what string, err error) {
			t.Helper()
			calls++
			switch {
			case err == nil, errors.Is(err, driver.ErrNotAcquired):
			case errors.Is(err, driver.ErrInvalidOption) && strings.Contains(err.Error(), "default_query_exec_mode=exec"):
				refused++
			default:
				t.Fatalf("%s: %v, want success, ErrNotAcquired, or ErrInvalidOption naming the fix", what, err)
			}
		}
		// A waiting Acquire that the pooler refuses returns at once with
		// the cause, not at its deadline. Where the pooler keeps prepared
		// statements (PgBouncer 1.21 and later, configured so), nothing
		// is refused, and the waiter takes the lock when the holder's
		// short lease runs out, well before its deadline.
		for i := range 10 {
			lease, err := a.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Second})
			check("Acquire", err)
			if lease == nil {
				continue
			}
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			other, err := b.Acquire(wctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: i%2 == 0})
			wcancel()
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a waiting Acquire behind the pooler ran to its deadline")
			}
			check("Acquire of a held lock", err)
			if other != nil {
				// The holder's lease ran out while the other waited.
				check("Release", other.Release(ctx))
				continue
			}
			check("Release", lease.Release(ctx))
		}
		t.Logf("%d of %d calls refused with the cause", refused, calls)
	})

	// The idempotency Store's claims that the pooler refuses say the cause
	// too, as a setup to mend (idempotency.ErrInvalid), never as an outage,
	// which httpmw's WithFailOpen would answer by serving keyed requests
	// unguarded; its other calls say the cause without it, and the
	// Executor tries them again.
	t.Run("store", func(t *testing.T) {
		direct, err := sqllock.NewStore(openDB(t, db, direct))
		if err != nil {
			t.Fatal(err)
		}
		if err := direct.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		refused := 0
		for i := range 20 {
			st, err := sqllock.NewStore(openDB(t, db, pooled))
			if err != nil {
				t.Fatal(err)
			}
			c := idempotency.Claim{Scope: "pgbouncer", Key: fmt.Sprintf("%s-%d", uniqueKey(t), i), Owner: "o", Lease: time.Minute}
			for _, err := range []error{
				func() error { _, err := st.Claim(ctx, c); return err }(),
				func() error { _, err := st.Get(ctx, c.Scope, c.Key); return err }(),
				st.Complete(ctx, c.Scope, c.Key, c.Owner, []byte("done"), time.Hour),
			} {
				switch {
				case err == nil, errors.Is(err, idempotency.ErrNotFound), errors.Is(err, idempotency.ErrNotOwner):
				case strings.Contains(err.Error(), "idempotency claim") && errors.Is(err, idempotency.ErrInvalid) && !errors.Is(err, driver.ErrUnavailable) && strings.Contains(err.Error(), "default_query_exec_mode=exec"):
					refused++
				case !strings.Contains(err.Error(), "idempotency claim") && !errors.Is(err, idempotency.ErrInvalid) && strings.Contains(err.Error(), "default_query_exec_mode=exec"):
					// Get and Complete stay what the Executor tries again:
					// the next try may reach a connection that knows the
					// statement.
				default:
					t.Fatalf("a Store call behind the pooler: %v, want success, or an error naming the fix, idempotency.ErrInvalid for a claim alone", err)
				}
			}
		}
		t.Logf("%d claims refused with the cause", refused)
	})

	t.Run("exec", func(t *testing.T) {
		fixed := pooled + "&default_query_exec_mode=exec"
		a := newLocker(t, openDB(t, db, fixed))
		b := newLocker(t, openDB(t, db, fixed))
		k := uniqueKey(t)
		var last uint64
		for range 10 {
			lease, err := a.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if lease.Token() <= last {
				t.Fatalf("token %d after %d", lease.Token(), last)
			}
			if _, err := b.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute}); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("Acquire of a held lock: %v, want ErrNotAcquired", err)
			}
			if errs := a.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute); errs[0] != nil {
				t.Fatalf("RefreshBatch: %v", errs[0])
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			got, err := b.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
			if err != nil {
				t.Fatalf("Acquire of a released lock: %v", err)
			}
			last = got.Token()
			if err := got.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
	})
}

// TestDeallocatedStatements: without a pooler, the statements pgx prepared
// and the server no longer knows (an application's DEALLOCATE ALL) are
// prepared again and run: a renewal, and a waiting Acquire, succeed, where
// the first refusal (SQLSTATE 26000) failed the renewal and ended the wait
// at once with an error about poolers.
func TestDeallocatedStatements(t *testing.T) {
	db := databases()[1]
	dsn := db.dsn(t)
	migrated(t, db, dsn)
	g := openDB(t, db, dsn)
	pool, err := g.DB()
	if err != nil {
		t.Fatal(err)
	}
	pool.SetMaxOpenConns(1) // DEALLOCATE ALL reaches the Locker's connection
	l := newLocker(t, g)
	other := newLocker(t, openDB(t, db, dsn))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	lease, err := l.Acquire(ctx, uniqueKey(t), driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if err := lease.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.ExecContext(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	if err := lease.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh after DEALLOCATE ALL: %v", err)
	}

	k := uniqueKey(t)
	held, err := other.Acquire(ctx, k, driver.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	// A short wait prepares a waiter's statements.
	wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = l.Acquire(wctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
	wcancel()
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("a short wait for a held lock: %v", err)
	}
	if _, err := pool.ExecContext(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	got, err := l.Acquire(ctx, k, driver.AcquireOptions{TTL: time.Minute, Wait: true})
	if err != nil {
		t.Fatalf("waiting Acquire after DEALLOCATE ALL: %v", err)
	}
	got.Release(ctx)
}
