package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseCommandFlags parses an older command's flags (flag.FlagSet, kept
// so its syntax does not change) with the command line's conventions:
// -h or --help prints the help on stdout and exits 0; a bad flag prints
// the error, then one line pointing at --help, and exits 2. Flags may
// come before or after the positional arguments, which it returns. code
// is the exit status when done is true.
func parseCommandFlags(fs *flag.FlagSet, args []string, help string, stdout, stderr io.Writer) (pos []string, code int, done bool) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	pos, err := parseInterspersed(fs, args)
	switch {
	case err == nil:
		return pos, 0, false
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, help)
		fmt.Fprintln(stdout, "\nFlags:")
		printFlags(stdout, fs)
		return nil, 0, true
	default:
		fmt.Fprintf(stderr, "sandgate %s: %v\nRun 'sandgate %s --help' for usage.\n", fs.Name(), err, fs.Name())
		return nil, 2, true
	}
}

// printFlags lists fs's flags with two dashes, as the cobra commands do.
// Defaults taken from the environment are not shown for secrets (token).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			typ = "" // a `quoted` word in a bool's usage is no value name
		}
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		def := f.DefValue
		if f.Name == "token" || def == "" || def == "false" || def == "0" {
			def = ""
		}
		if def != "" {
			usage += fmt.Sprintf(" (default %q)", def)
		}
		fmt.Fprintf(w, "%s\n        %s\n", line, strings.ReplaceAll(usage, "\n", "\n        "))
	})
}
