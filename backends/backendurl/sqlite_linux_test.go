package backendurl

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestSQLiteOpenedWhileAnotherWrites: replicas started together on a new
// SQLite file open it while another is writing to it in its rollback
// journal (creating its tables). Switching the journal to WAL, which each
// connection does on opening, needs the file to itself and waits for no
// busy timeout: a replica that met the other's lock failed at once with
// SQLITE_BUSY, and must wait instead. The replicas are processes of their
// own (this test binary, run again), as replicas are; SQLite parts the
// connections of one process as well (TestSQLiteStaysLocked's writer is in
// the process that opens).
//
// The write goes on until as many opens as there are replicas have met
// its lock: an open refused closes the file, which inotify reports (the
// write's own connection keeps it open), and a replica whose open failed
// then exits with an error.
func TestSQLiteOpenedWhileAnotherWrites(t *testing.T) {
	if path := os.Getenv("WARDEN_TEST_OPEN_SQLITE"); path != "" {
		openWhenTold(t, path)
		return
	}
	const replicas = 3
	dir := t.TempDir()
	path := filepath.Join(dir, "fresh.db")
	tx := writing(t, path)
	closes := watchCloses(t, path)
	cmds := make([]*exec.Cmd, replicas)
	outs := make([]*bytes.Buffer, replicas)
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestSQLiteOpenedWhileAnotherWrites$", "-test.count=1")
		cmds[i].Env = append(os.Environ(), "WARDEN_TEST_OPEN_SQLITE="+path)
		outs[i] = new(bytes.Buffer)
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	// The replicas open together once all have started, however long
	// starting took each: each open waits for the write within a bound
	// of its own.
	deadline := time.Now().Add(time.Minute)
	for {
		ready, _ := filepath.Glob(path + ".ready.*")
		if len(ready) == replicas {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d replicas started within a minute", len(ready), replicas)
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.WriteFile(path+".go", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for refused := 0; refused < replicas; {
		n, err := closes(deadline)
		if err != nil {
			t.Fatalf("%d opens met the write's lock: %v", refused, err)
		}
		refused += n
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Errorf("a replica's open: %v\n%s", err, outs[i])
		}
	}
}

// openWhenTold is a replica of TestSQLiteOpenedWhileAnotherWrites: it says
// it has started, waits to be told to open the file at path, and opens it.
func openWhenTold(t *testing.T, path string) {
	u, err := Parse("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".ready."+strconv.Itoa(os.Getpid()), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for _, err := os.Stat(path + ".go"); err != nil; _, err = os.Stat(path + ".go") {
		if time.Now().After(deadline) {
			t.Fatalf("not told to open within a minute: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	o := NewOpener()
	defer o.Close()
	if _, err := o.Locker(context.Background(), u, time.Second); err != nil {
		t.Fatal(err)
	}
}

// watchCloses watches the file at path with inotify, and returns a
// function that waits, until deadline, for it to be closed, and says how
// many times it was since its last call.
func watchCloses(t *testing.T, path string) func(deadline time.Time) (int, error) {
	t.Helper()
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	// Non-blocking, the descriptor is pollable: reads heed deadlines.
	f := os.NewFile(uintptr(fd), "inotify")
	t.Cleanup(func() { f.Close() })
	if _, err := syscall.InotifyAddWatch(fd, path, syscall.IN_CLOSE); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64*(syscall.SizeofInotifyEvent+syscall.NAME_MAX+1))
	return func(deadline time.Time) (int, error) {
		if err := f.SetReadDeadline(deadline); err != nil {
			return 0, err
		}
		n, err := f.Read(buf)
		if err != nil {
			return 0, err
		}
		// Each event: wd, mask, cookie and len, four 32-bit integers, and
		// len bytes of name.
		closed := 0
		for b := buf[:n]; len(b) >= syscall.SizeofInotifyEvent; {
			if binary.NativeEndian.Uint32(b[4:])&syscall.IN_CLOSE != 0 {
				closed++
			}
			b = b[min(len(b), syscall.SizeofInotifyEvent+int(binary.NativeEndian.Uint32(b[12:]))):]
		}
		return closed, nil
	}
}
