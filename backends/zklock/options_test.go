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
