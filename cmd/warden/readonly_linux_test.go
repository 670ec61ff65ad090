package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/glebarez/sqlite"

	"github.com/warden-go/warden/backends/sqllock"
)

// TestReadOnlySQLiteWithoutShm: a file in WAL mode, opened read-only
// (mode=ro) by a user who may not write its directory, with no -shm file
// beside it, cannot be read; the command says why and what mends it,
// rather than that the file has no lock table, which it has. With
// immutable=1 the file is read.
func TestReadOnlySQLiteWithoutShm(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "warden-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Chmod(dir, 0o700)
		os.RemoveAll(dir)
	})
	file := filepath.Join(dir, "locks.db")
	db := sqlDB(t, sqlite.Open(file+"?_pragma=journal_mode(WAL)"))
	l, err := sqllock.New(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	pool, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // the last connection removes -wal and -shm
	if _, err := os.Stat(file + "-shm"); !os.IsNotExist(err) {
		t.Fatalf("%s-shm after the last connection closed: %v", file, err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}

	run := func(lockURL string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "-lock", lockURL, "locks", "ls")
		cmd.Env = append(os.Environ(), "WARDEN_LOCK=")
		if os.Geteuid() == 0 {
			// root writes any directory: run as nobody, who must reach
			// the binary.
			if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), errOut.String()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, errOut.String()
	}
	code, errOut := run("sqlite://file:" + file + "?mode=ro")
	if code != 1 || strings.Contains(errOut, "no lock table") || !strings.Contains(errOut, "-shm") {
		t.Errorf("locks ls on a WAL file without -shm in a directory it may not write: exit %d, %q; want 1, naming the -shm file, not a missing table", code, errOut)
	}
	if code, errOut := run("sqlite://file:" + file + "?mode=ro&immutable=1"); code != 0 {
		t.Errorf("locks ls with immutable=1: exit %d, %q; want 0", code, errOut)
	}
}
