// Package backendurl opens warden's backends from URLs, the way a service
// takes them from flags or the environment: memory, sqlite://PATH (a file,
// with SQLite's parameters if any; never an in-memory database, which
// would be one per pooled connection), postgres://..., mysql://...,
// redis://[user:pass@]host:port[/db], rediss://... (TLS),
// redlock://[user:pass@]h1,h2,h3[/db] (redlocks:// for TLS),
// etcd://[user:pass@]host:port[,...], zk://[user:pass@]host:port[,...]
// (a ZooKeeper digest user's credentials: the Locker and the store
// authenticate as that user, and the nodes they create are that user's
// alone, zk.AuthACL) and consul://host:port (an agent's HTTP address); a
// host may be an IPv6 literal, [::1]:2379. The example service and the
// warden CLI both use it; it links every backend and its client, so a
// program that needs one backend imports that backend instead.
//
// The nodes a zk:// URL's user creates first are the roots too (/warden,
// /warden/locks, /warden/idem and the store's buckets): another user, or a
// URL without credentials, is refused every lock and record under them
// (zk.ErrNoAuth): the warden CLI's locks ls, which may not list the lock
// root, fails as a whole. It shows a lock of another user's as a "?" row,
// and exits 4, only where the roots are not that user's (created by a client
// without credentials, or with an ACL naming both users). Every service and
// operator sharing these locks uses the same user. Several users sharing
// them need an ACL naming them all, which a URL cannot give: zklock.WithACL
// and zklock.WithStoreACL in code (with the roots created with it), or
// zklock.WithRoot and zklock.WithStoreRoot for a root per user.
//
// A URL prints redacted (String): its user info, the values of its query
// parameters whose names say "pass" (pgx reads ?password=), and the whole
// of anything it cannot parse unambiguously are replaced by xxxxx. Errors
// this package returns show none of those secrets either; a user name may
// appear in them, as the server's refusal quotes it (PostgreSQL's
// "password authentication failed for user", MySQL's "Access denied for
// user"): a user name is not scrubbed from messages, where a common one
// (postgres, root) would mask every other use of the word.
package backendurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	goredis "github.com/redis/go-redis/v9"
)

// URL is a parsed backend URL.
type URL struct {
	// Scheme is memory, sqlite, postgres, mysql, redis, redlock, etcd, zk or
	// consul (rediss and redlocks are redis and redlock over TLS).
	Scheme string
	// Path is the database file (sqlite).
	Path string
	// DSN is the driver's data source name (postgres, mysql).
	DSN string
	// Hosts are the servers, host:port each (redis, redlock, etcd, zk,
	// consul).
	Hosts []string

	redis              []*goredis.Options // redis: one; redlock: one per master
	username, password string             // etcd, zk (a digest user's)
	shown              string             // String's answer
	secrets            []string           // what Redact removes from text
}

// SQL reports whether u names a SQL database.
func (u *URL) SQL() bool {
	return u.Scheme == "sqlite" || u.Scheme == "postgres" || u.Scheme == "mysql"
}

// String is the URL redacted, to be printed in errors, logs and banners.
func (u *URL) String() string { return u.shown }

// masked replaces every secret in a printed URL.
const masked = "xxxxx"

// Redact returns s, a backend URL or DSN as a user gave it, in the form it
// may be printed: user info and password parameters masked, and the whole
// of it masked but its scheme when it cannot be parsed.
func Redact(s string) string {
	if u, err := Parse(s); err == nil {
		return u.String()
	}
	if scheme, _, ok := strings.Cut(s, "://"); ok && validScheme(scheme) {
		return scheme + "://" + masked
	}
	return masked
}

// RedactError returns err with u's secrets (of 4 bytes or more) removed
// from its message, should a client library have quoted one; errors.Is and
// errors.As see err. An Opener's error that starts with its own words
// keeps them, and a name in them, whole ("no lock table warden_locks",
// where the password is "warden"): the client library's error after them
// is redacted.
func (u *URL) RedactError(err error) error {
	if err == nil {
		return nil
	}
	if d, ok := err.(*described); ok {
		cause := u.RedactError(d.err)
		if cause == d.err {
			return err
		}
		return &redacted{msg: d.words + cause.Error(), err: err}
	}
	msg := err.Error()
	clean := u.redactText(msg)
	if clean == msg {
		return err
	}
	return &redacted{msg: clean, err: err}
}

func (u *URL) redactText(s string) string {
	var secrets []string
	for _, secret := range u.secrets {
		// A password of a few characters would match all over a message;
		// String never shows it, and no client library quotes one.
		if len(secret) >= minScrubbed && !slices.Contains(secrets, secret) {
			secrets = append(secrets, secret)
		}
	}
	// The longest first: a user info goes whole, not its password alone.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	var pairs []string
	for _, secret := range secrets {
		pairs = append(pairs, secret, masked)
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// minScrubbed is the shortest secret RedactError looks for.
const minScrubbed = 4

// described is an error of the Opener's: its own words, which quote no
// secret, before the error of a client library that it wraps, which may.
type described struct {
	words string // with the ": " before err
	err   error
}

// describe is err after the Opener's words, which format and args make.
func describe(err error, format string, args ...any) error {
	return &described{words: fmt.Sprintf(format, args...) + ": ", err: err}
}

func (e *described) Error() string { return e.words + e.err.Error() }
func (e *described) Unwrap() error { return e.err }

// redacted is an error whose message has had secrets removed.
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// Parse reads a backend URL: memory, sqlite://PATH, postgres://...,
// mysql://user:pass@tcp(host:port)/db, redis://[user:pass@]host:port[/db],
// rediss://..., redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db], redlocks://...,
// etcd://[user:pass@]host:port[,...], zk://[user:pass@]host:port[,...] or
// consul://host:port. A password with a reserved character (/ @ : % ?
// #) is percent-encoded in every URL but mysql://, whose part after the
// scheme is go-sql-driver's DSN, read as it is: there the password is
// written raw (the DSN's last '@' ends it). Redis URLs take
// go-redis's query options (redis.ParseURL), applied to every RedLock
// master. A query option given twice is refused, rather than one of the
// two ignored. Its errors name what is wrong and never quote a secret.
func Parse(s string) (*URL, error) {
	if s == "memory" {
		return &URL{Scheme: "memory", shown: s}, nil
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || !validScheme(scheme) {
		return nil, fmt.Errorf("not a backend URL (want memory, or SCHEME://... with SCHEME one of %s)", schemes)
	}
	unparseable := fmt.Errorf("%s://%s: not a valid URL (percent-encode reserved characters such as / @ : %% in a password)", scheme, masked)
	u := &URL{Scheme: scheme}
	switch scheme {
	case "sqlite":
		u.shown = s
		if rest == "" {
			return nil, fmt.Errorf("%s: no file path", u)
		}
		if strings.ContainsAny(rest, "@?") {
			// Paths are no secret, but user info or parameters may be,
			// and an error may quote any part of the path.
			u.shown, u.secrets = scheme+"://"+masked, []string{rest}
			if i := strings.LastIndex(rest, "@"); i >= 0 {
				u.secrets = append(u.secrets, rest[:i])
			}
			if _, q, ok := strings.Cut(rest, "?"); ok {
				u.secrets = append(u.secrets, q)
			}
		}
		if strings.Contains(rest, "@/") {
			// USER:PASS@/path: SQLite has no users, and would take the
			// text up to a '?' in the password for a file to create.
			return nil, fmt.Errorf("%s: sqlite:// takes a file path, and no user info", u)
		}
		if _, q, ok := strings.Cut(rest, "?"); ok {
			// SQLite takes the last of an option given twice, and
			// sqliteInMemory the first.
			if err := repeatedOption(u, q); err != nil {
				return nil, err
			}
		}
		if sqliteInMemory(rest) {
			// Each connection of the pool would open a database of its
			// own: a lock taken on one is not seen on the next, whose
			// database has no lock table at all.
			return nil, fmt.Errorf("%s: an in-memory or temporary SQLite database is one per connection, and a pool holds several: use memory for an in-process backend, or a file", u)
		}
		u.Path = rest
		return u, nil
	case "mysql":
		return parseMySQL(u, rest)
	case "postgres", "postgresql", "redis", "rediss", "redlock", "redlocks", "etcd", "zk", "consul":
	default:
		return nil, fmt.Errorf("%s://%s: unknown scheme %q (want one of %s, or memory alone)", scheme, masked, scheme, schemes)
	}
	authority, _, _ := strings.Cut(rest, "/")
	authority, _, _ = strings.Cut(authority, "?")
	if list := authority[strings.LastIndex(authority, "@")+1:]; strings.Contains(list, ",") && slices.Contains(strings.Split(list, ","), "") {
		return nil, fmt.Errorf("%s://%s: an empty host in the list of hosts (two commas, or one at an end)", scheme, masked)
	}
	p, err := parseHosts(s, scheme, rest, authority)
	// Where a password with an '@', '/', '?' or '#' that was not
	// percent-encoded ends cannot be told (client libraries tell it
	// differently): two '@' in the authority, an '@' past it (as written:
	// a database name may hold a percent-encoded one), or a '#'.
	if err != nil || p.Opaque != "" || strings.Count(authority, "@") > 1 || strings.Contains(p.EscapedPath()+p.RawQuery, "@") || strings.Contains(s, "#") {
		return nil, unparseable
	}
	u.shown = redactParsed(p)
	u.secrets = secretsOf(p)
	if err := repeatedOption(u, p.RawQuery); err != nil {
		return nil, err
	}
	if _, hasPassword := p.User.Password(); p.User != nil && !hasPassword && (strings.HasPrefix(scheme, "redis") || strings.HasPrefix(scheme, "redlock")) {
		// go-redis reads it as a user name and, with no password, sends no
		// credentials at all: the server's NOAUTH would be the first sign.
		return nil, fmt.Errorf("%s: a user info without ':' is a user name with no password, and no credentials are sent (redis-cli reads it as the password): write %s://:PASSWORD@host:port for a password, %s://USER:PASSWORD@host:port for an ACL user", u, scheme, scheme)
	}
	switch scheme {
	case "postgres", "postgresql":
		u.Scheme = "postgres"
		u.DSN = s
		return u, nil
	case "redis", "rediss":
		u.Scheme = "redis"
		if strings.Contains(p.Host, ",") {
			return nil, fmt.Errorf("%s: redis:// takes one host:port (use redlock:// for several)", u)
		}
		o, err := goredis.ParseURL(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u, u.RedactError(err))
		}
		if err := negativeTimeout(timeout{"dial_timeout", o.DialTimeout}, timeout{"pool_timeout", o.PoolTimeout}); err != nil {
			return nil, fmt.Errorf("%s: %w", u, err)
		}
		u.Hosts, u.redis = []string{o.Addr}, []*goredis.Options{o}
		return u, nil
	}
	if p.Path == "/" && (scheme == "etcd" || scheme == "zk" || scheme == "consul") {
		// A trailing slash, as an agent's address is often copied
		// (http://127.0.0.1:8500/), names no path.
		p.Path = ""
	}
	for h := range strings.SplitSeq(p.Host, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || port == "" {
			return nil, fmt.Errorf("%s: %q is not host:port", u, h)
		}
		if strings.Contains(host, "%") && (scheme == "etcd" || scheme == "consul") {
			// The etcd and Consul clients read the address as a URL, where
			// the zone's '%' is an invalid escape: every dial would fail.
			return nil, fmt.Errorf("%s: %q: the %s client takes no IPv6 zone (%%25...) in an address", u, h, scheme)
		}
		u.Hosts = append(u.Hosts, h)
	}
	switch scheme {
	case "redlock", "redlocks":
		u.Scheme = "redlock"
		if len(u.Hosts) < 3 || len(u.Hosts)%2 == 0 {
			return nil, fmt.Errorf("%s: redlock:// needs an odd number of nodes, at least 3", u)
		}
		master := *p
		master.Scheme = "redis"
		if scheme == "redlocks" {
			master.Scheme = "rediss"
		}
		for _, h := range u.Hosts {
			master.Host = h
			o, err := goredis.ParseURL(master.String())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", u, u.RedactError(err))
			}
			if err := negativeTimeout(timeout{"dial_timeout", o.DialTimeout}, timeout{"pool_timeout", o.PoolTimeout}); err != nil {
				return nil, fmt.Errorf("%s: %w", u, err)
			}
			u.redis = append(u.redis, o)
		}
	case "etcd":
		if p.Path != "" || p.RawQuery != "" {
			return nil, fmt.Errorf("%s: etcd:// takes hosts only", u)
		}
		if p.User != nil {
			u.username = p.User.Username()
			u.password, _ = p.User.Password()
		}
	case "zk":
		if p.Path != "" {
			return nil, fmt.Errorf("%s: zk:// takes a digest user's credentials and hosts only (a chroot is not supported)", u)
		}
		if p.RawQuery != "" {
			return nil, fmt.Errorf("%s: zk:// takes a digest user's credentials and hosts only, no query parameters", u)
		}
		if p.User != nil {
			if err := zkDigest(p.User); err != nil {
				return nil, fmt.Errorf("%s: %w", u, err)
			}
			u.username = p.User.Username()
			u.password, _ = p.User.Password()
		}
	case "consul":
		if p.User != nil || p.Path != "" || p.RawQuery != "" || len(u.Hosts) != 1 {
			return nil, fmt.Errorf("%s: consul:// takes one host:port, an agent's HTTP address", u)
		}
	}
	return u, nil
}

// zkDigest says why user cannot be a ZooKeeper digest user's credentials,
// which ZooKeeper reads as user:password, the user up to the first ':'.
// An empty password, which a URL gets by a stray ':', is refused as a
// missing one.
func zkDigest(user *url.Userinfo) error {
	if password, _ := user.Password(); password == "" || user.Username() == "" {
		return errors.New("zk:// takes a digest user's credentials as user:password, neither empty")
	}
	if strings.Contains(user.Username(), ":") {
		return errors.New("a ZooKeeper digest user name has no ':'")
	}
	return nil
}

// parseHosts is url.Parse(s) for a URL whose authority may list several
// hosts, which url.Parse reads as one host and refuses as soon as one of
// them is an IPv6 literal: a list is parsed host by host, and its hosts,
// as url.Parse reads each, are joined again in Host.
func parseHosts(s, scheme, rest, authority string) (*url.URL, error) {
	at := strings.LastIndex(authority, "@") + 1
	list := authority[at:]
	if !strings.Contains(list, ",") {
		return url.Parse(s)
	}
	p, err := url.Parse(scheme + "://" + authority[:at] + "host" + rest[len(authority):])
	if err != nil {
		return nil, err
	}
	var hosts []string
	for h := range strings.SplitSeq(list, ",") {
		hp, err := url.Parse("//" + h)
		if err != nil || hp.Host == "" || hp.User != nil || hp.Path != "" || hp.RawQuery != "" || hp.ForceQuery {
			return nil, errors.New("not a list of hosts")
		}
		hosts = append(hosts, hp.Host)
	}
	p.Host = strings.Join(hosts, ",")
	return p, nil
}

// parseMySQL reads a go-sql-driver DSN after mysql://.
func parseMySQL(u *URL, rest string) (*URL, error) {
	if !strings.Contains(rest, "@tcp(") && !strings.Contains(rest, "@unix(") {
		return nil, fmt.Errorf("mysql://%s: want mysql://user:pass@tcp(host:port)/db", masked)
	}
	cfg, err := mysql.ParseDSN(rest)
	if err != nil {
		// The driver's messages may quote a parameter: none is shown.
		return nil, fmt.Errorf("mysql://%s: not a valid DSN (want mysql://user:pass@tcp(host:port)/db?param=value)", masked)
	}
	if cfg.Passwd != "" {
		u.secrets = append(u.secrets, cfg.Passwd, url.QueryEscape(cfg.Passwd))
	}
	if err := negativeTimeout(timeout{"timeout", cfg.Timeout}, timeout{"readTimeout", cfg.ReadTimeout}, timeout{"writeTimeout", cfg.WriteTimeout}); err != nil {
		return nil, fmt.Errorf("mysql://%s: %w", masked, err)
	}
	if err := autocommitOff(cfg.Params); err != nil {
		return nil, fmt.Errorf("mysql://%s: %w", masked, err)
	}
	u.DSN = rest
	// The parameters are what follows a '?' after the last '/', as the
	// driver reads them: a password may hold a '?' or "parseTime=".
	_, params, hasParams := strings.Cut(rest[strings.LastIndex(rest, "/")+1:], "?")
	if !strings.Contains("&"+params, "&parseTime=") {
		sep := "?"
		if hasParams {
			sep = "&"
		}
		u.DSN += sep + "parseTime=true"
	}
	shown := cfg.Clone()
	if shown.User != "" || shown.Passwd != "" {
		shown.User, shown.Passwd = masked, ""
	}
	for k, v := range shown.Params {
		if secretParam(k) || secretParam(v) {
			u.secrets = append(u.secrets, v)
			shown.Params[k] = masked
		}
	}
	u.shown = "mysql://" + shown.FormatDSN()
	if err := repeatedOption(u, params); err != nil {
		return nil, err
	}
	return u, nil
}

// autocommitOff refuses a DSN parameter that turns autocommit off, which the
// driver sets on every connection: each statement would then open a
// transaction that nothing commits, so that a release or a delete said
// done would be undone when the connection closes (sqllock's Migrate
// refuses such a session too, whatever set it).
func autocommitOff(params map[string]string) error {
	for k, v := range params {
		if !strings.EqualFold(k, "autocommit") {
			continue
		}
		switch strings.ToLower(strings.Trim(v, "'\"")) {
		case "1", "on", "true":
		default:
			return fmt.Errorf("%s=%s: the statements would stay uncommitted; leave autocommit on", k, v)
		}
	}
	return nil
}

// sqliteInMemory reports whether an SQLite path, as SQLite reads it with
// its parameters, names a database private to the connection that opens
// it: :memory:, a file: URI with mode=memory, or no file name (a
// temporary database).
func sqliteInMemory(path string) bool {
	name, params, _ := strings.Cut(path, "?")
	name = strings.TrimPrefix(name, "file:")
	q, _ := url.ParseQuery(params)
	return name == "" || name == ":memory:" || q.Get("mode") == "memory"
}

// timeout is a client's timeout option, by its name in the URL.
type timeout struct {
	name string
	d    time.Duration
}

// negativeTimeout returns an error naming the first of options that is
// negative, or nil. The client would set a deadline already past: every
// dial (or read, or wait for a pooled connection) would fail at once as a
// timeout, which reads as a server that does not answer. (Redis's
// read_timeout and write_timeout of -1 and -2 mean no timeout and no
// deadline: those are not asked about.)
func negativeTimeout(options ...timeout) error {
	for _, o := range options {
		if o.d < 0 {
			return fmt.Errorf("%s is negative: every attempt would time out at once", o.name)
		}
	}
	return nil
}

// schemes lists what Parse reads, for its errors.
const schemes = "sqlite, postgres (or postgresql), mysql, redis, rediss, redlock, redlocks, etcd, zk, consul"

// validScheme reports whether s has the shape of a URL scheme, so that it
// can be printed: a letter, then letters, digits, '+', '-' or '.'.
func validScheme(s string) bool {
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return s != "" && len(s) <= 32
}

// secretParam reports whether a query parameter carries a secret, by its
// name: password, pass, sslpassword, passwd, pwd and the like; or by its
// value, which may set one (PostgreSQL's ?options=-c password=...).
func secretParam(name string) bool {
	name = strings.ToLower(name)
	return strings.Contains(name, "pass") || name == "pwd" || strings.Contains(name, "secret") || strings.Contains(name, "token")
}

// redactParsed is p printed with its user info and secret parameters
// masked.
func redactParsed(p *url.URL) string {
	shown := *p
	if p.User != nil {
		shown.User = url.User(masked)
	}
	var q []string
	for kv := range strings.SplitSeq(p.RawQuery, "&") {
		if k, v, _ := strings.Cut(kv, "="); secretParam(unescape(k)) || secretParam(unescape(v)) {
			kv = k + "=" + masked
		}
		q = append(q, kv)
	}
	shown.RawQuery = strings.Join(q, "&")
	return shown.String()
}

// secretsOf lists p's secrets, decoded and as written, for RedactError.
func secretsOf(p *url.URL) []string {
	var s []string
	add := func(v, raw string) {
		if v != "" {
			s = append(s, v, raw, url.QueryEscape(v), url.PathEscape(v))
		}
	}
	if p.User != nil {
		pw, _ := p.User.Password()
		raw, _ := strings.CutPrefix(p.User.String(), p.User.Username()+":")
		add(pw, raw)
		s = append(s, p.User.String())
	}
	for kv := range strings.SplitSeq(p.RawQuery, "&") {
		if k, v, _ := strings.Cut(kv, "="); secretParam(unescape(k)) || secretParam(unescape(v)) {
			add(unescape(v), v)
		}
	}
	return s
}

// repeatedOption returns an error naming the first option of rawQuery,
// the query of u, given a second time, or nil. One of the two would be
// ignored without a word: an sslmode=require before a disable, say, or a
// tls=true before a false (go-redis, pgx, the MySQL driver and SQLite
// take the last). Names compare as the clients read them: spaces around
// a name are dropped (pgx, like libpq, reads "& sslmode" as sslmode), and
// the names that set the same thing are one (see option).
func repeatedOption(u *URL, rawQuery string) error {
	seen := map[string]bool{}
	for kv := range strings.SplitSeq(rawQuery, "&") {
		k, _, _ := strings.Cut(kv, "=")
		k = option(u.Scheme, strings.Trim(unescape(k), " "))
		if k != "" && seen[k] {
			return fmt.Errorf("%s: option %q given twice", u, k)
		}
		seen[k] = true
	}
	return nil
}

// option is the option that the URL parameter name sets for scheme's
// client, or "" for a parameter that may be given more than once. For
// PostgreSQL, ssl (=true) sets sslmode and database sets dbname; for
// SQLite, each _pragma runs a pragma of its own.
func option(scheme, name string) string {
	switch {
	case (scheme == "postgres" || scheme == "postgresql") && name == "ssl":
		return "sslmode"
	case (scheme == "postgres" || scheme == "postgresql") && name == "database":
		return "dbname"
	case scheme == "sqlite" && name == "_pragma":
		return ""
	}
	return name
}

func unescape(s string) string {
	if v, err := url.QueryUnescape(s); err == nil {
		return v
	}
	return s
}
