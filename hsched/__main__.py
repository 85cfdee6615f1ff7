from hsched.cli import main

main()
