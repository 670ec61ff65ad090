package zklock

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/warden-go/warden/guard/driver"
)

// TestNewRefusesBadRoot: a root ZooKeeper would refuse as a path is refused
// by New, naming it, instead of failing every request with "invalid path".
func TestNewRefusesBadRoot(t *testing.T) {
	for _, root := range []string{
		"/a//b", "/a/../b", "/a/./b", "/..", "/a\x00b", "/a\x01b", "/a\u0085b", "/a\ue000b",
		"a/b", "", "/", "/a/", "/a\xffb",
	} {
		l, err := New([]string{"127.0.0.1:1"}, WithRoot(root), WithLogger(discard{}))
		if err == nil {
			l.Close()
			t.Errorf("New with root %q succeeded", root)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), strconv.Quote(root)) {
			t.Errorf("New with root %q: %v, want ErrInvalidOption naming the root", root, err)
		}
	}
	for _, root := range []string{"/a", "/warden/locks", "/équipe/verrous", "/a.b/c..d/..."} {
		l, err := New([]string{"127.0.0.1:1"}, WithRoot(root), WithLogger(discard{}))
		if err != nil {
			t.Errorf("New with root %q: %v", root, err)
			continue
		}
		l.Close()
	}
	if _, err := New([]string{"127.0.0.1:1", " "}, WithLogger(discard{})); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("New with an empty server address: %v, want ErrInvalidOption", err)
	}
}

// TestNewRefusesBadServers: a server address the client library could
// never dial is refused by New, naming it, instead of failing every call
// as an outage; a chroot after the port, as the Java client's connect
// string has it, is told apart.
func TestNewRefusesBadServers(t *testing.T) {
	for _, addr := range []string{
		"127.0.0.1:2181/app", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:zk", "127.0.0.1:", "zk://127.0.0.1:2181", "[::1:2181",
	} {
		l, err := New([]string{"127.0.0.1:2181", addr}, WithLogger(discard{}))
		if err == nil {
			l.Close()
			t.Errorf("New with server %q succeeded", addr)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), strconv.Quote(addr)) {
			t.Errorf("New with server %q: %v, want ErrInvalidOption naming the address", addr, err)
		}
	}
	if _, err := New([]string{"127.0.0.1:2181/app"}, WithLogger(discard{})); err == nil || !strings.Contains(err.Error(), "WithRoot") {
		t.Errorf("New with a chroot: %v, want an error that points to WithRoot", err)
	}
	for _, addr := range []string{"127.0.0.1", "127.0.0.1:2181", "[::1]:2181", "localhost:2181"} {
		l, err := New([]string{addr}, WithLogger(discard{}))
		if err != nil {
			t.Errorf("New with server %q: %v", addr, err)
			continue
		}
		l.Close()
	}
}

// TestNewRefusesServerList: the Java client's connect string given as one
// server address, a list of servers with commas between them and perhaps a
// chroot after, is refused by New with an error that says to give each
// server as its own element and, for a chroot, to use WithRoot.
func TestNewRefusesServerList(t *testing.T) {
	for addr, want := range map[string][]string{
		"h1:2181,h2:2181":     {`["h1:2181" "h2:2181"]`, "its own element"},
		"h1,h2":               {`["h1" "h2"]`, "its own element"},
		"h1:2181,h2:2181/app": {`["h1:2181" "h2:2181"]`, "its own element", "(/app) to WithRoot"},
	} {
		l, err := New([]string{addr}, WithLogger(discard{}))
		if err == nil {
			l.Close()
			t.Errorf("New with server %q succeeded", addr)
			continue
		}
		for _, w := range want {
			if !errors.Is(err, driver.ErrInvalidOption) || !strings.Contains(err.Error(), w) {
				t.Errorf("New with server %q: %v, want ErrInvalidOption saying %s", addr, err, w)
			}
		}
	}
}
