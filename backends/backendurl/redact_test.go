package backendurl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Secrets are written into URLs of every scheme, as operators write them:
// in the user info, percent-encoded or not, with the characters that make a
// URL ambiguous, as a lone user info, and as password query parameters.
var secretShapes = []string{"s3cretpw", "s3c/ret", "s3c@ret", "s3c:ret", "s3c%ret", "s3c?ret", "s3c#ret", "s3c,ret"}

// URLShapes returns URLs of every scheme with secret written in, each as
// a user would type it.
func URLShapes(secret string) []string {
	enc := url.QueryEscape(secret)
	var out []string
	for _, pw := range []string{secret, enc} {
		out = append(out,
			"redis://admin:"+pw+"@127.0.0.1:1",
			"redis://:"+pw+"@127.0.0.1:1/2",
			"redis://"+pw+"@127.0.0.1:1",
			"rediss://admin:"+pw+"@127.0.0.1:1/0?dial_timeout=1s",
			"redlock://admin:"+pw+"@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
			"redlocks://admin:"+pw+"@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/1",
			"etcd://root:"+pw+"@127.0.0.1:1,127.0.0.1:2",
			"zk://super:"+pw+"@127.0.0.1:1",
			"postgres://warden:"+pw+"@127.0.0.1:1/warden?sslmode=disable",
			"postgresql://warden@127.0.0.1:1/warden?password="+pw,
			"postgres://127.0.0.1:1/warden?user=warden&pass="+pw+"&sslmode=disable",
			"postgres://127.0.0.1:1/warden?sslpassword="+pw,
			"postgres://warden@127.0.0.1:1/warden?options=-c%20password%3D"+pw,
			"mysql://warden:"+pw+"@tcp(127.0.0.1:1)/warden",
			"mysql://warden:"+pw+"@tcp(127.0.0.1:1)/warden?parseTime=true&password="+pw,
			"sqlite://warden:"+pw+"@/tmp/x.db",
			"warden:"+pw+"@127.0.0.1:1",
			"redis//admin:"+pw+"@127.0.0.1:1",
			"ftp://admin:"+pw+"@127.0.0.1:1",
			"postgres://u:"+pw+"@[::1/db",
			"\x00:"+pw+"://",
		)
	}
	return out
}

// TestRedactEveryShape: whatever the scheme and however the password is
// written, neither Parse's error, nor String, nor Redact shows it.
func TestRedactEveryShape(t *testing.T) {
	for _, secret := range secretShapes {
		for _, s := range URLShapes(secret) {
			u, err := Parse(s)
			shown := []string{Redact(s)}
			if err != nil {
				shown = append(shown, err.Error())
			} else {
				shown = append(shown, u.String(), u.RedactError(errors.New("dial "+s+": refused")).Error())
			}
			for _, out := range shown {
				if leaks(out, secret) {
					t.Errorf("%q: %q shows the password", s, out)
				}
			}
		}
	}
}

// leaks reports whether out shows secret, or the part of it after or
// before its special character (a password cut at '/' still gives most of
// it away).
func leaks(out, secret string) bool {
	for _, part := range []string{secret, url.QueryEscape(secret), "s3c", "ret", "cretpw"} {
		if strings.Contains(out, part) {
			return true
		}
	}
	return false
}

// TestRedisURLOptions: redis:// and rediss:// take what go-redis's ParseURL
// takes, and RedLock gives it to every master.
func TestRedisURLOptions(t *testing.T) {
	u, err := Parse("rediss://app:pw@10.0.0.1:6380/4?dial_timeout=3s")
	if err != nil {
		t.Fatal(err)
	}
	if o := u.redis[0]; u.Scheme != "redis" || o.Username != "app" || o.Password != "pw" || o.DB != 4 || o.TLSConfig == nil || o.Addr != "10.0.0.1:6380" || o.DialTimeout != 3*time.Second {
		t.Fatalf("rediss URL: %+v", o)
	}
	u, err = Parse("redlocks://app:pw@a:1,b:2,c:3/2")
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "redlock" || len(u.redis) != 3 {
		t.Fatalf("redlocks URL: %+v", u)
	}
	for i, o := range u.redis {
		if o.Username != "app" || o.Password != "pw" || o.DB != 2 || o.TLSConfig == nil || o.Addr != u.Hosts[i] {
			t.Errorf("master %d: %+v", i, o)
		}
	}
	if u, err := Parse("redis://127.0.0.1:1"); err != nil || u.redis[0].TLSConfig != nil || u.redis[0].Password != "" {
		t.Errorf("plain redis URL: %+v, %v", u, err)
	}
	if _, err := Parse("redis://127.0.0.1:1?nosuchoption=1"); err == nil || !strings.Contains(err.Error(), "nosuchoption") {
		t.Errorf("an unknown option: %v", err)
	}
}

// TestRedisCredentials connects with a user and password of its own,
// created for the test with ACL SETUSER on the test servers.
func TestRedisCredentials(t *testing.T) {
	ctx := context.Background()
	user := "h22b-" + strings.ReplaceAll(time.Now().Format("150405.000000000"), ".", "")
	const pw = "p@ss/w:rd%"
	for _, tc := range []struct{ env, def string }{
		{"WARDEN_REDIS_ADDR", "127.0.0.1:16379"},
		{"WARDEN_REDLOCK_ADDRS", "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382"},
	} {
		addrs := strings.Split(envOr(tc.env, tc.def), ",")
		if len(addrs) > 3 {
			addrs = addrs[:3]
		}
		for _, a := range addrs {
			admin, err := Parse("redis://" + a)
			if err != nil {
				t.Fatal(err)
			}
			o := NewOpener()
			c, err := o.openRedis(ctx, admin.redis[0])
			if err != nil {
				skipOrFail(t, err)
			}
			if err := c.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pw, "~*", "&*", "+@all").Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				c.Do(context.Background(), "ACL", "DELUSER", user)
				o.Close()
			})
		}
		scheme := "redis://"
		if len(addrs) > 1 {
			scheme = "redlock://"
		}
		good := scheme + user + ":" + url.QueryEscape(pw) + "@" + strings.Join(addrs, ",") + "/3"
		o := NewOpener()
		defer o.Close()
		u, err := Parse(good)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.Locker(ctx, u, time.Second); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		bad, err := Parse(strings.Replace(good, url.QueryEscape(pw), "wrong"+url.QueryEscape(pw), 1))
		if err != nil {
			t.Fatal(err)
		}
		_, err = o.Locker(ctx, bad, time.Second)
		if err == nil || strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), url.QueryEscape(pw)) {
			t.Fatalf("%s with a wrong password: %v", bad, err)
		}
	}
}

// TestSQLiteMissingDirectory: the error names the directory, where SQLite
// says "out of memory (14)".
func TestSQLiteMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "x.db")
	u, err := Parse("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	o := NewOpener()
	defer o.Close()
	_, err = o.Locker(context.Background(), u, time.Second)
	if err == nil || !strings.Contains(err.Error(), filepath.Dir(path)) || strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("sqlite in a missing directory: %v; want an error naming %s", err, filepath.Dir(path))
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func skipOrFail(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("WARDEN_REQUIRE_SERVERS") != "" {
		t.Fatal(err)
	}
	t.Skip(err)
}

// TestRedisUserWithoutPassword: redis://secret@host is a user name with no
// password to go-redis, which then sends no credentials: refused, naming
// both forms that say what was meant, and without the secret.
func TestRedisUserWithoutPassword(t *testing.T) {
	for _, s := range []string{"redis://s3cretpw@127.0.0.1:1", "rediss://s3cretpw@127.0.0.1:1/0", "redlock://s3cretpw@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"} {
		_, err := Parse(s)
		if err == nil || !strings.Contains(err.Error(), "://:PASSWORD@") || !strings.Contains(err.Error(), "://USER:PASSWORD@") || leaks(err.Error(), "s3cretpw") {
			t.Errorf("%s: %v; want a refusal naming both forms, without the secret", Redact(s), err)
		}
	}
	for _, s := range []string{"redis://:s3cretpw@127.0.0.1:1", "redis://app:s3cretpw@127.0.0.1:1", "redis://127.0.0.1:1"} {
		if _, err := Parse(s); err != nil {
			t.Errorf("%s: %v", Redact(s), err)
		}
	}
}

// TestRedactKeepsTheOpenersWords: of an Opener's error, the client
// library's part is redacted and the Opener's own words, which may hold
// the password as a word of a name, are kept.
func TestRedactKeepsTheOpenersWords(t *testing.T) {
	u, err := Parse("postgres://warden:warden@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	got := u.RedactError(describe(errors.New(`relation "warden_locks" does not exist`), "no %s table %s", "lock", "warden_locks"))
	if want := `no lock table warden_locks: relation "xxxxx_locks" does not exist`; got.Error() != want {
		t.Errorf("RedactError: %q, want %q", got, want)
	}
	// Words of the Opener's under another error's are not told apart.
	wrapped := fmt.Errorf("opening: %w", describe(errors.New("warden"), "table warden_locks"))
	if got := u.RedactError(wrapped).Error(); got != "opening: table xxxxx_locks: xxxxx" {
		t.Errorf("RedactError of a wrapped Opener's error: %q", got)
	}
}
