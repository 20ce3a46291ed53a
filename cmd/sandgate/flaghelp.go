package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// parseCommandFlags parses an older command's flags (flag.FlagSet, kept
// so its syntax does not change) with the command line's conventions:
// -h or --help prints the help on stdout and exits 0; a bad flag prints
// the error, then one line pointing at --help, and exits 2. Flags may
// come before or after the positional arguments, which it returns. code
// is the exit status when done is true.
func parseCommandFlags(fs *flag.FlagSet, args []string, help string, stdout, stderr io.Writer) (pos []string, code int, done bool) {
	quietFlags(fs)
	pos, err := parseInterspersed(fs, args)
	switch {
	case err == nil:
		return pos, 0, false
	case errors.Is(err, flag.ErrHelp):
		printHelp(stdout, fs, help, nil)
		return nil, 0, true
	default:
		printUsageError(stderr, fs.Name(), err)
		return nil, 2, true
	}
}

// quietFlags stops fs from printing anything itself: the callers print
// help and errors the same way for every command.
func quietFlags(fs *flag.FlagSet) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
}

// printUsageError prints a command line mistake: the error first, then
// one line pointing at --help (never the whole flag list, which would
// scroll the error away). name is the command after "sandgate".
func printUsageError(w io.Writer, name string, err error) {
	msg := flagDashes.ReplaceAllString(err.Error(), "$1--")
	fmt.Fprintf(w, "sandgate %s: %s\nRun 'sandgate %s --help' for usage.\n", name, msg, name)
}

// flagDashes finds the one-dash flag names in the flag package's errors,
// which the help and the README spell with two.
var flagDashes = regexp.MustCompile(`(not defined: |for flag |needs an argument: |syntax: )-`)

// printHelp prints a command's help text and its flags. envTwin, if not
// nil, names the environment variable each flag also reads.
func printHelp(w io.Writer, fs *flag.FlagSet, help string, envTwin func(string) string) {
	fmt.Fprint(w, help)
	fmt.Fprintln(w, "\nFlags:")
	printFlags(w, fs, envTwin)
}

// printFlags lists fs's flags with two dashes, as the cobra commands do,
// each with its environment twin when envTwin is not nil. Defaults taken
// from the environment are not shown for secrets (token).
func printFlags(w io.Writer, fs *flag.FlagSet, envTwin func(string) string) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			typ = "" // a `quoted` word in a bool's usage is no value name
		}
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if envTwin != nil {
			line += "  [$" + envTwin(f.Name) + "]"
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
