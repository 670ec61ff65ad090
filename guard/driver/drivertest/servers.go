package drivertest

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// RequireServersEnv names the environment variable that turns a missing test
// server from a skip into a failure. `make test` sets it, so CI can never pass
// by skipping the backends it was meant to exercise.
const RequireServersEnv = "WARDEN_REQUIRE_SERVERS"

// Addr returns the value of the environment variable env (def when unset),
// a comma-separated list of host:port, after checking that the first address
// accepts TCP connections. When it does not, the test is skipped, or fails
// when WARDEN_REQUIRE_SERVERS=1.
func Addr(t testing.TB, env, def string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		v = def
	}
	first := strings.Split(v, ",")[0]
	conn, err := net.DialTimeout("tcp", first, 2*time.Second)
	if err != nil {
		Unreachable(t, env, v, err)
		return ""
	}
	conn.Close()
	return v
}

// Unreachable skips or fails t (per WARDEN_REQUIRE_SERVERS) because the server
// named by env at addr could not be used. For backends whose address is not a
// plain host:port (a DSN), after their own connection attempt failed.
func Unreachable(t testing.TB, env, addr string, err error) {
	t.Helper()
	if os.Getenv(RequireServersEnv) == "1" {
		t.Fatalf("test server %s=%q unreachable: %v (run `make services`)", env, addr, err)
	}
	t.Skipf("test server %s=%q unreachable: %v (run `make services`, or set %s=1 to fail instead)", env, addr, err, RequireServersEnv)
}
