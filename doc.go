// Package warden guards scheduled jobs and HTTP requests with distributed
// locks. This package holds no code: it is the module's front page. Start
// with package guard (Guard.Do), pick a backend under backends/, and see
// scheduler (singleton cron jobs), idempotency and httpmw (work done once
// per idempotency key).
//
// The README at the module's root is the guide for newcomers; its Go
// snippets are compiled by this package's test.
package warden
