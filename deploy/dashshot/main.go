// Command dashshot renders the idem Grafana dashboard (its timeseries panels)
// to a PNG from a Prometheus server's real data, for places where no Grafana
// runs: every panel's queries go through Prometheus's query_range API over
// the window given, and each series is drawn with the panel's legend format.
//
//	go run ./deploy/dashshot -prom http://127.0.0.1:9090 -start 2026-11-30T01:10:00Z -end 2026-11-30T01:11:00Z -out docs/dashboard.png
//
// It is how docs/dashboard.png was made (docs/operations.md, "The dashboard").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Panels []panel `json:"panels"`
}

type series struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"`
}

func main() {
	prom := flag.String("prom", "http://127.0.0.1:9090", "Prometheus base URL")
	dash := flag.String("dashboard", "deploy/grafana/dashboards/idem.json", "dashboard JSON")
	start := flag.String("start", "", "start of the window (RFC 3339)")
	end := flag.String("end", "", "end of the window (RFC 3339)")
	step := flag.Duration("step", time.Second, "query resolution")
	rateWindow := flag.String("rate-interval", "10s", "what $__rate_interval stands for")
	title := flag.String("title", "idem dashboard", "title printed above the panels")
	out := flag.String("out", "docs/dashboard.png", "PNG to write")
	flag.Parse()
	if err := run(*prom, *dash, *start, *end, *step, *rateWindow, *title, *out); err != nil {
		fmt.Fprintln(os.Stderr, "dashshot:", err)
		os.Exit(1)
	}
}

func run(prom, dashFile, startS, endS string, step time.Duration, rateWindow, title, out string) error {
	t0, err1 := time.Parse(time.RFC3339, startS)
	t1, err2 := time.Parse(time.RFC3339, endS)
	if err := errors.Join(err1, err2); err != nil || !t1.After(t0) {
		return fmt.Errorf("need -start < -end, RFC 3339: %v", err)
	}
	b, err := os.ReadFile(dashFile)
	if err != nil {
		return err
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", dashFile, err)
	}
	var ps []panel
	var walk func([]panel)
	walk = func(in []panel) {
		for _, p := range in {
			if p.Type == "timeseries" {
				ps = append(ps, p)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)

	const cols = 3
	rows := (len(ps) + cols - 1) / cols
	img := vgimg.NewWith(vgimg.UseWH(vg.Points(1500), vg.Points(float64(40+rows*300))), vgimg.UseDPI(96))
	dc := draw.New(img)
	header := draw.Crop(dc, 0, 0, dc.Max.Y-dc.Min.Y-vg.Points(34), 0)
	sty := plot.New().Title.TextStyle
	sty.Font.Size = vg.Points(16)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YCenter
	header.FillText(sty, vg.Point{X: (dc.Max.X + dc.Min.X) / 2, Y: dc.Max.Y - vg.Points(18)}, title)
	body := draw.Crop(dc, 0, 0, 0, -vg.Points(40))
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	ctx := context.Background()
	for i, p := range ps {
		pl, err := render(ctx, prom, p, t0, t1, step, rateWindow)
		if err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
		pl.Draw(tiles.At(body, i%cols, i/cols))
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

var palette = []color.RGBA{
	{0x73, 0xbf, 0x69, 0xff}, {0xf2, 0xcc, 0x0c, 0xff}, {0x56, 0x94, 0xf2, 0xff}, {0xff, 0x78, 0x29, 0xff},
	{0xf2, 0x49, 0x5c, 0xff}, {0xb8, 0x77, 0xd9, 0xff}, {0x8a, 0xb8, 0xff, 0xff}, {0x96, 0xd9, 0x8d, 0xff},
}

var legendRE = regexp.MustCompile(`\{\{\s*([a-zA-Z_]+)\s*\}\}`)

// render draws one panel: every target's series over [t0, t1].
func render(ctx context.Context, prom string, p panel, t0, t1 time.Time, step time.Duration, rateWindow string) (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.Title.TextStyle.Font.Size = vg.Points(12)
	pl.X.Label.Text = "seconds since start"
	pl.Y.Label.Text = unitLabel(p.FieldConfig.Defaults.Unit)
	pl.Legend.Top = true
	pl.Legend.TextStyle.Font.Size = vg.Points(8)
	pl.Add(plotter.NewGrid())
	n := 0
	for _, tg := range p.Targets {
		expr := strings.NewReplacer("$__rate_interval", rateWindow, "$group", ".*").Replace(tg.Expr)
		ss, err := queryRange(ctx, prom, expr, t0, t1, step)
		if err != nil {
			return nil, err
		}
		sort.Slice(ss, func(i, j int) bool { return fmt.Sprint(ss[i].Metric) < fmt.Sprint(ss[j].Metric) })
		for _, s := range ss {
			var xys plotter.XYs
			for _, v := range s.Values {
				ts, _ := v[0].(float64)
				str, _ := v[1].(string)
				y, err := strconv.ParseFloat(str, 64)
				if err != nil || math.IsNaN(y) || math.IsInf(y, 0) {
					continue
				}
				xys = append(xys, plotter.XY{X: ts - float64(t0.Unix()), Y: y})
			}
			if len(xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			l.Color = palette[n%len(palette)]
			l.Width = vg.Points(1.5)
			n++
			pl.Add(l)
			name := legendRE.ReplaceAllStringFunc(tg.LegendFormat, func(m string) string {
				return s.Metric[legendRE.FindStringSubmatch(m)[1]]
			})
			if n <= 8 {
				pl.Legend.Add(shorten(name), l)
			}
		}
	}
	pl.X.Min, pl.X.Max = 0, t1.Sub(t0).Seconds()
	if pl.Y.Min > 0 {
		pl.Y.Min = 0
	}
	if pl.Y.Max <= pl.Y.Min {
		pl.Y.Max = pl.Y.Min + 1
	}
	pl.Y.Max *= 1.35 // room for the legend
	return pl, nil
}

// tierRE and dlqRE find idem's generated topic names in a legend.
var (
	tierRE = regexp.MustCompile(`[^\s/]+\.retry\.([0-9]+)`)
	dlqRE  = regexp.MustCompile(`[^\s/]+\.dlq\b`)
)

// shorten names retry tiers and DLQs by their role ("<topic>.<group>.retry.2"
// → "retry 2") and trims what is still long.
func shorten(s string) string {
	s = tierRE.ReplaceAllString(s, "retry $1")
	s = dlqRE.ReplaceAllString(s, "dlq")
	if r := []rune(s); len(r) > 42 {
		return "…" + string(r[len(r)-41:])
	}
	return s
}

func unitLabel(u string) string {
	switch u {
	case "ops":
		return "per second"
	case "s":
		return "seconds"
	case "percentunit":
		return "ratio"
	}
	return ""
}

func queryRange(ctx context.Context, prom, expr string, t0, t1 time.Time, step time.Duration) ([]series, error) {
	q := url.Values{"query": {expr}, "start": {strconv.FormatInt(t0.Unix(), 10)}, "end": {strconv.FormatInt(t1.Unix(), 10)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(prom, "/")+"/api/v1/query_range?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []series `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err
	}
	if env.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, env.Error)
	}
	return env.Data.Result, nil
}
