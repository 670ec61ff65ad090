package debugpage

import (
	_ "embed"
	"html/template"
	"time"

	"github.com/warden-go/warden/scheduler"
)

//go:embed page.html
var pageSrc string

// page is parsed once; a template is safe for concurrent execution.
var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"since": func(now, t time.Time) string { return now.Sub(t).Round(time.Millisecond).String() },
	"until": func(now, t time.Time) string { return t.Sub(now).Round(time.Millisecond).String() },
	"outcomeClass": func(o scheduler.Outcome) string {
		switch o {
		case scheduler.Ran:
			return "ok"
		case scheduler.Skipped:
			return ""
		}
		return "bad"
	},
}).Parse(pageSrc))
