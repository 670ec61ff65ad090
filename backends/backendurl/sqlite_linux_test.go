package backendurl

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestSQLiteOpenedWhileAnotherWrites: replicas started together on a new
// SQLite file open it while another connection is writing to it in its
// rollback journal (creating its tables). Switching the journal to WAL,
// which each connection does on opening, needs the file to itself and
// waits for no busy timeout: an open that met the write's lock failed at
// once with SQLITE_BUSY, and must wait instead. The replicas are processes
// of their own (this test binary, run again), as replicas are; SQLite parts
// the connections of one process as well (TestSQLiteStaysLocked's writer
// is in the process that opens).
//
// The write goes on until every replica has said, on a pipe of its own,
// that it is opening the file, and holdOpens more: each open's first
// attempt meets the lock, and an open that does not wait ends its replica
// meanwhile, which fails the test at once with the replica's output. Then
// the write ends, and every open must succeed.
func TestSQLiteOpenedWhileAnotherWrites(t *testing.T) {
	if os.Getenv("WARDEN_TEST_OPEN_SQLITE") != "" {
		openWhenTold(t, os.Getenv("WARDEN_TEST_OPEN_SQLITE"))
		return
	}
	const replicas = 3
	path := filepath.Join(t.TempDir(), "fresh.db")
	tx := writing(t, path)
	defer tx.Rollback()
	// Room for all that the replicas say, so that none waits to be heard.
	said := make(chan string, 2*replicas) // "ready" and "opening" from each
	ended := make(chan replicaEnd, replicas)
	tell := make([]io.WriteCloser, replicas)
	for i := range tell {
		tell[i] = startReplica(t, path, said, ended)
	}
	deadline := time.After(time.Minute)
	// heard waits for n replicas to say what, failing when one ends first.
	heard := func(what string, n int) {
		t.Helper()
		for ; n > 0; n-- {
			select {
			case s := <-said:
				if s != what {
					t.Fatalf("a replica said %q; want %q", s, what)
				}
			case e := <-ended:
				t.Fatalf("a replica ended while the write went on, with %d yet to say %q: %v\n%s", n, what, e.err, e.out)
			case <-deadline:
				t.Fatalf("%d replicas did not say %q within a minute", n, what)
			}
		}
	}
	// The replicas open together once all have started, however long
	// starting took each: each open waits for the write within a bound
	// of its own.
	heard("ready", replicas)
	for _, w := range tell {
		if _, err := io.WriteString(w, "open\n"); err != nil {
			t.Fatal(err)
		}
	}
	heard("opening", replicas)
	select {
	case e := <-ended:
		t.Fatalf("a replica's open ended while the write went on: %v\n%s", e.err, e.out)
	case <-time.After(holdOpens):
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	for range replicas {
		if e := <-ended; e.err != nil {
			t.Errorf("a replica's open: %v\n%s", e.err, e.out)
		}
	}
}

// holdOpens is how long TestSQLiteOpenedWhileAnotherWrites's write goes
// on after the last replica said it was opening: past the open's longest
// pause between two tries (100 ms), well within its bound (5 s).
const holdOpens = 500 * time.Millisecond

// replicaEnd is how a replica of TestSQLiteOpenedWhileAnotherWrites ended:
// its exit status and output.
type replicaEnd struct {
	err error
	out []byte
}

// startReplica starts a replica of TestSQLiteOpenedWhileAnotherWrites on
// path, which sends each line it says on said and its end on ended (which
// have room for them), and returns
// the pipe that tells it to open. The replica is killed, if it still runs,
// and waited for when the test ends.
func startReplica(t *testing.T, path string, said chan<- string, ended chan<- replicaEnd) io.WriteCloser {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSQLiteOpenedWhileAnotherWrites$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WARDEN_TEST_OPEN_SQLITE="+path)
	out := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = out, out
	tell, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	says, saying, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{saying} // the replica's fd 3
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	saying.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for lines := bufio.NewScanner(says); lines.Scan(); {
			said <- lines.Text()
		}
		says.Close()
		err := cmd.Wait()
		ended <- replicaEnd{err, out.Bytes()}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return tell
}

// openWhenTold is a replica of TestSQLiteOpenedWhileAnotherWrites: it says
// on fd 3 that it has started, waits to be told on stdin to open the file
// at path, says it is opening it, and opens it.
func openWhenTold(t *testing.T, path string) {
	u, err := Parse("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	say := os.NewFile(3, "say")
	if _, err := fmt.Fprintln(say, "ready"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("not told to open: %v", err)
	}
	if _, err := fmt.Fprintln(say, "opening"); err != nil {
		t.Fatal(err)
	}
	o := NewOpener()
	defer o.Close()
	if _, err := o.Locker(context.Background(), u, time.Second); err != nil {
		t.Fatal(err)
	}
}
