package main

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Bars are drawn on a log10 axis: a bar's height is log10(v/base), so it
// starts at base and the axis ticks are labelled in the original unit.
type logAxis struct {
	base  float64 // value at the axis' origin
	label func(float64) string
}

func (a logAxis) y(v float64) float64 {
	if v <= a.base {
		return 0
	}
	return math.Log10(v / a.base)
}

// apply sets p's Y axis: ticks at each power of ten from base up to one
// decade above top, which leaves room for the labels and the legend. X
// spans the n bars with half a bar of margin.
func (a logAxis) apply(p *plot.Plot, top float64, n int) {
	var ts []plot.Tick
	for t := a.base; ; t *= 10 {
		ts = append(ts, plot.Tick{Value: a.y(t), Label: a.label(t)})
		if t > top*5 {
			break
		}
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ts)
	p.Y.Min = 0
	p.Y.Max = ts[len(ts)-1].Value
	p.X.Min, p.X.Max = -0.6, float64(n)-0.4
	p.Add(plotter.NewGrid())
}

var (
	throughputAxis = logAxis{base: 100, label: func(v float64) string {
		switch {
		case v >= 1e6:
			return fmt.Sprintf("%gM", v/1e6)
		case v >= 1e3:
			return fmt.Sprintf("%gk", v/1e3)
		}
		return fmt.Sprint(v)
	}}
	latencyAxis = logAxis{base: 0.1, label: func(v float64) string { return fmt.Sprint(v) }}

	blue   = color.RGBA{R: 0x3b, G: 0x6e, B: 0xb5, A: 0xff}
	shades = []color.Color{
		color.RGBA{R: 0x9e, G: 0xcb, B: 0x8f, A: 0xff}, // p50
		color.RGBA{R: 0xf0, G: 0xb4, B: 0x4c, A: 0xff}, // p95
		color.RGBA{R: 0xd6, G: 0x4f, B: 0x3c, A: 0xff}, // p99
	}
)

// drawChart draws throughput (top) and latency percentiles (bottom) per
// scenario into a PNG.
func drawChart(r *report, path string) error {
	var names []string
	var rows []scenarioResult
	for _, s := range r.Scenarios {
		if s.Error == "" {
			names = append(names, s.Name)
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("no successful scenario to draw")
	}
	top, err := throughputPlot(r, names, rows)
	if err != nil {
		return err
	}
	bottom, err := latencyPlot(r, names, rows)
	if err != nil {
		return err
	}
	width := vg.Length(max(900, 110*len(rows)))
	img := vgimg.NewWith(vgimg.UseWH(width, 900), vgimg.UseDPI(96))
	dc := draw.New(img)
	t := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	cs := plot.Align([][]*plot.Plot{{top}, {bottom}}, t, dc)
	top.Draw(cs[0][0])
	bottom.Draw(cs[1][0])
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func basePlot(title, ylabel string, names []string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.Y.Label.Text = ylabel
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 9
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YTop
	p.X.Tick.Label.Font.Size = vg.Points(11)
	p.Y.Tick.Label.Font.Size = vg.Points(11)
	return p
}

func throughputPlot(r *report, names []string, rows []scenarioResult) (*plot.Plot, error) {
	p := basePlot(fmt.Sprintf("Throughput, msgs/s (log scale; median of %d runs; %d cores)", r.Runs, r.Machine.Cores), "msgs/s", names)
	top := 0.0
	for _, s := range rows {
		top = max(top, s.MsgsPerSec)
	}
	throughputAxis.apply(p, top, len(rows))
	vals := make(plotter.Values, len(rows))
	labels := plotter.XYLabels{XYs: make(plotter.XYs, len(rows)), Labels: make([]string, len(rows))}
	for i, s := range rows {
		vals[i] = throughputAxis.y(s.MsgsPerSec)
		labels.XYs[i] = plotter.XY{X: float64(i), Y: vals[i]}
		labels.Labels[i] = thousands(s.MsgsPerSec)
		switch {
		case s.VsNaiveLoop > 0:
			labels.Labels[i] += "\n" + ratio(s.VsNaiveLoop) + "× naive"
		default:
			if s.VsRawSarama > 0 {
				labels.Labels[i] += "\n" + ratio(s.VsRawSarama) + "× sarama"
			}
			if s.VsRawKgo > 0 {
				labels.Labels[i] += "\n" + ratio(s.VsRawKgo) + "× kgo"
			}
		}
		if s.VsVersus > 0 {
			labels.Labels[i] += "\n" + ratio(s.VsVersus) + "× " + s.Versus
		}
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(36))
	if err != nil {
		return nil, err
	}
	bars.Color = blue
	bars.LineStyle.Width = 0
	l, err := barLabels(labels)
	if err != nil {
		return nil, err
	}
	p.Add(bars, l)
	return p, nil
}

func latencyPlot(r *report, names []string, rows []scenarioResult) (*plot.Plot, error) {
	p := basePlot(fmt.Sprintf("End-to-end latency, ms (log scale) at half of each scenario's throughput (≤ %s msgs/s), %gs each",
		thousands(r.LatencyMaxRate), r.LatencySeconds), "ms", names)
	top := 0.0
	rates := plotter.XYLabels{XYs: make(plotter.XYs, len(rows)), Labels: make([]string, len(rows))}
	for i, s := range rows {
		top = max(top, s.P99ms)
		rates.XYs[i] = plotter.XY{X: float64(i), Y: latencyAxis.y(max(s.P50ms, s.P95ms, s.P99ms))}
		rates.Labels[i] = "at " + thousands(s.LatencyRate) + "/s"
		if s.LatencyRecords == 0 {
			rates.Labels[i] = "no latency run"
		}
	}
	latencyAxis.apply(p, top, len(rows))
	const w = 14
	for k, q := range []struct {
		name string
		get  func(scenarioResult) float64
	}{
		{"p50", func(s scenarioResult) float64 { return s.P50ms }},
		{"p95", func(s scenarioResult) float64 { return s.P95ms }},
		{"p99", func(s scenarioResult) float64 { return s.P99ms }},
	} {
		vals := make(plotter.Values, len(rows))
		for i, s := range rows {
			vals[i] = latencyAxis.y(q.get(s))
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(w))
		if err != nil {
			return nil, err
		}
		bars.Color = shades[k]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Points(float64(k-1) * w)
		p.Add(bars)
		p.Legend.Add(q.name, bars)
	}
	l, err := barLabels(rates)
	if err != nil {
		return nil, err
	}
	p.Add(l)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(11)
	return p, nil
}

// barLabels are small centred texts just above the given points.
func barLabels(xyl plotter.XYLabels) (*plotter.Labels, error) {
	l, err := plotter.NewLabels(xyl)
	if err != nil {
		return nil, err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].XAlign = draw.XCenter
		l.TextStyle[i].Font.Size = vg.Points(9)
	}
	l.Offset = vg.Point{Y: vg.Points(4)}
	return l, nil
}
