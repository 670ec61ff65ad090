package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestTTLTheBackendRefuses: a -ttl within the flag's own range that the
// lock backend does not honour (etcd's leases count whole seconds) is a bad
// flag: one line naming -ttl and why, exit status 2.
func TestTTLTheBackendRefuses(t *testing.T) {
	etcd := "etcd://" + drivertest.Addr(t, "WARDEN_ETCD_ENDPOINTS", "127.0.0.1:12379")
	var stderr strings.Builder
	code := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-admin-addr", "",
		"-db", "sqlite://" + filepath.Join(t.TempDir(), "orders.db"), "-lock", etcd, "-ttl", "2500ms"}, io.Discard, &stderr)
	if msg := stderr.String(); code != 2 || !strings.HasPrefix(msg, "closeorder: -ttl: ") || !strings.Contains(msg, "whole multiple") || strings.Count(msg, "\n") != 1 {
		t.Fatalf("-ttl 2500ms on etcd: exit %d, %q; want 2 and one line naming -ttl and etcd's unit", code, msg)
	}
}

// TestInstanceThatCannotLabelALock: the instance labels the replica's locks,
// so one an operator's terminal would obey (a control character) is
// refused as the flag it is, in one line, before anything starts.
func TestInstanceThatCannotLabelALock(t *testing.T) {
	var stderr strings.Builder
	code := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-admin-addr", "",
		"-db", "sqlite://" + filepath.Join(t.TempDir(), "orders.db"), "-instance", "r1\x1b[2J"}, io.Discard, &stderr)
	if msg := stderr.String(); code != 2 || !strings.HasPrefix(msg, "closeorder: -instance: ") || !strings.Contains(msg, "control character") || strings.Count(msg, "\n") != 1 {
		t.Fatalf("-instance with an escape: exit %d, %q; want 2 and one line naming -instance", code, msg)
	}
}

// TestFlagTheParserRefuses: a value the flag parser itself refuses is told
// in one line naming the flag, as the flags checked after parsing are,
// without the usage; -h prints the usage.
func TestFlagTheParserRefuses(t *testing.T) {
	var stderr strings.Builder
	code := run(context.Background(), []string{"-ttl", "1x"}, io.Discard, &stderr)
	if msg := stderr.String(); code != 2 || !strings.Contains(msg, "-ttl") || strings.Count(msg, "\n") != 1 {
		t.Errorf("-ttl 1x: exit %d, %q; want 2 and one line naming -ttl", code, msg)
	}
	stderr.Reset()
	run(context.Background(), []string{"-h"}, io.Discard, &stderr)
	if msg := stderr.String(); !strings.Contains(msg, "-unpaid-after") {
		t.Errorf("-h: %q; want the usage", msg)
	}
}
