// Package backendurl opens warden's backends from URLs, the way a service
// takes them from flags or the environment: memory, sqlite://PATH,
// postgres://..., mysql://..., redis://host:port, redlock://h1,h2,h3,
// etcd://host:port[,...], zk://host:port[,...] and consul://host:port (an
// agent's HTTP address). The example service and
// the warden CLI both use it; it links every backend and its client, so a
// program that needs one backend imports that backend instead.
package backendurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
)

// URL is a parsed backend URL.
type URL struct {
	// Scheme is memory, sqlite, postgres, mysql, redis, redlock, etcd, zk or
	// consul.
	Scheme string
	// Path is the database file (sqlite).
	Path string
	// DSN is the driver's data source name (postgres, mysql).
	DSN string
	// Hosts are the servers, host:port each (redis, redlock, etcd, zk,
	// consul).
	Hosts []string

	raw string // as given
}

// SQL reports whether u names a SQL database.
func (u *URL) SQL() bool {
	return u.Scheme == "sqlite" || u.Scheme == "postgres" || u.Scheme == "mysql"
}

// String masks any password, so the URL can be printed in errors and logs.
func (u *URL) String() string { return MaskPassword(u.raw) }

// userinfoPassword is compiled once and never changed.
var userinfoPassword = regexp.MustCompile(`(//[^:/@]*):[^@/]*@`)

// MaskPassword hides the password of every URL in s (an error message, a
// URL), so that it can be logged.
func MaskPassword(s string) string { return userinfoPassword.ReplaceAllString(s, "$1:xxxxx@") }

// Parse reads a backend URL: memory, sqlite://PATH, postgres://...,
// mysql://user:pass@tcp(host:port)/db, redis://host:port,
// redlock://h1:p1,h2:p2,h3:p3, etcd://host:port[,...],
// zk://host:port[,...] or consul://host:port. Its errors name what is wrong and mask passwords.
func Parse(s string) (*URL, error) {
	if s == "memory" {
		return &URL{Scheme: "memory", raw: s}, nil
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return nil, fmt.Errorf("%q is not a backend URL (want memory or scheme://...)", MaskPassword(s))
	}
	u := &URL{Scheme: scheme, raw: s}
	switch scheme {
	case "sqlite":
		if rest == "" {
			return nil, fmt.Errorf("%s: no file path", u)
		}
		u.Path = rest
	case "postgres", "postgresql":
		u.Scheme = "postgres"
		if _, err := url.Parse(s); err != nil {
			return nil, fmt.Errorf("%s: %v", u, errors.Unwrap(err))
		}
		u.DSN = s
	case "mysql":
		if !strings.Contains(rest, "@tcp(") && !strings.Contains(rest, "@unix(") {
			return nil, fmt.Errorf("%s: want mysql://user:pass@tcp(host:port)/db", u)
		}
		u.DSN = rest
		if !strings.Contains(rest, "parseTime=") {
			sep := "?"
			if strings.Contains(rest, "?") {
				sep = "&"
			}
			u.DSN += sep + "parseTime=true"
		}
	case "redis", "redlock", "etcd", "zk", "consul":
		for _, h := range strings.Split(rest, ",") {
			if _, port, err := net.SplitHostPort(h); err != nil || port == "" {
				return nil, fmt.Errorf("%s: %q is not host:port", u, h)
			}
			u.Hosts = append(u.Hosts, h)
		}
		if scheme == "redis" && len(u.Hosts) != 1 {
			return nil, fmt.Errorf("%s: redis:// takes one host:port (use redlock:// for several)", u)
		}
		if scheme == "consul" && len(u.Hosts) != 1 {
			return nil, fmt.Errorf("%s: consul:// takes one host:port, an agent's HTTP address", u)
		}
		if scheme == "redlock" && (len(u.Hosts) < 3 || len(u.Hosts)%2 == 0) {
			return nil, fmt.Errorf("%s: redlock:// needs an odd number of nodes, at least 3", u)
		}
	default:
		return nil, fmt.Errorf("%s: unknown scheme %q", u, scheme)
	}
	return u, nil
}
