import sys

from sglang_pcie.tools.cli import main

sys.exit(main())
