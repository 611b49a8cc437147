from gdnbench.cli import main

main()
